//! Small disks for tests of full marker roots: a loop-mounted ext4 file system of a few
//! MiB mounted as a target's marker root, filled block by block or inode by inode.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use opmark::lab::Target;

use super::text;

/// A small ext4 file system mounted as a target's marker root; unmounted on drop.
pub struct SmallDisk {
    /// Where it is mounted: the target's marker root.
    pub mount: PathBuf,
    image: PathBuf,
}

impl SmallDisk {
    /// `size_kib` KiB with room for `inodes` inodes, no reserved blocks (the tests run as
    /// root, who could otherwise use them).
    pub fn mount_as_marker_root(target: &Target, size_kib: u32, inodes: u32) -> SmallDisk {
        let mount = target.marker_root();
        let image = target.dir.join("marker-root.img");
        std::fs::create_dir_all(&mount).unwrap();
        let file = std::fs::File::create(&image).unwrap();
        file.set_len(u64::from(size_kib) * 1024).unwrap();
        sh(&format!(
            "mkfs.ext4 -q -F -m 0 -O ^has_journal -N {inodes} {img} && mount -o loop {img} {mnt} && chmod 700 {mnt}",
            img = image.display(),
            mnt = mount.display()
        ));
        SmallDisk { mount, image }
    }

    /// Fills every free block: the free space is allocated at once (`fallocate`, no data
    /// written, so a large disk fills as fast as a small one), then files grow until the
    /// disk says ENOSPC. A disk already full of other files is left as it is.
    pub fn fill_blocks(&self) -> PathBuf {
        let filler = self.mount.join("filler");
        if std::fs::create_dir_all(&filler).is_err() {
            return filler;
        }
        if let Ok(free) = rustix::fs::statvfs(&self.mount) {
            let bytes = free.f_bavail * free.f_frsize;
            let _ = Command::new("fallocate")
                .args(["-l", &bytes.to_string()])
                .arg(filler.join("bulk"))
                .stderr(Stdio::null())
                .status();
        }
        // Smaller writes take the last blocks a big one leaves.
        for bs in ["4k", "1k", "512"] {
            let _ = Command::new("dd")
                .arg("if=/dev/zero")
                .arg(format!("of={}", filler.join(bs).display()))
                .arg(format!("bs={bs}"))
                .stderr(Stdio::null())
                .status();
            sh(&format!("sync {}", self.mount.display()));
        }
        filler
    }

    /// Gives back what [`SmallDisk::fill_blocks`] took.
    pub fn free_blocks(&self) {
        let _ = std::fs::remove_dir_all(self.mount.join("filler"));
        sh(&format!("sync {}", self.mount.display()));
    }

    /// Takes every free inode but `spare`, with empty files in `fill/`.
    pub fn fill_inodes(&self, spare: usize) -> PathBuf {
        let fill = self.mount.join("fill");
        std::fs::create_dir_all(&fill).unwrap();
        let mut made = Vec::new();
        for i in 0.. {
            let f = fill.join(i.to_string());
            if std::fs::File::create(&f).is_err() {
                break;
            }
            made.push(f);
            assert!(i < 100_000, "the inode count never ran out");
        }
        for f in made.iter().rev().take(spare) {
            std::fs::remove_file(f).unwrap();
        }
        fill
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazy: a supervisor may still hold a file open for a moment.
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

pub fn sh(script: &str) {
    let out = Command::new("sh").arg("-c").arg(script).output().unwrap();
    assert!(
        out.status.success(),
        "`{script}` failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// True when loop mounts can be made (root, mkfs.ext4, mount); else skip or fail in CI.
pub fn needs_loop_mounts(name: &str) -> bool {
    super::require_root(name) && super::require_tools(name, &["mkfs.ext4", "mount", "umount"])
}
