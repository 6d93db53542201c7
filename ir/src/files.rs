//! Reading files a model names, or that a caller hands smelt, as untrusted input: every
//! file is a regular file whose size is bounded before any byte is read, and a path a
//! model names (`.tir` `external<...>` sidecars, ONNX external data) stays inside the
//! model's folder, or inside a root the caller allowed explicitly.
//!
//! - [`open_regular`] opens without blocking (a FIFO would otherwise wait for a writer)
//!   and checks the *opened handle* is a regular file, so `/dev/zero`, a FIFO or a
//!   directory is refused without being read, even through a symlink.
//! - [`read_regular`] adds the size bound, checked on that handle before allocating, and
//!   reads no more than the length it checked (a file growing meanwhile is cut there).
//! - [`Confinement`] resolves a location one component at a time, following symlinks
//!   itself, and refuses a step that leaves every allowed folder *before* touching the
//!   path it leads to: a file outside is never opened or examined, so the error is the
//!   same whether it exists or not.

use std::fs::File;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// Symlinks followed while resolving one location, as Linux's own limit (`ELOOP`).
const MAX_SYMLINKS: usize = 40;

/// Opens `path` for reading and checks, on the opened handle, that it is a regular file;
/// returns it with its length. `follow` says whether a symlink as the last component is
/// followed (a path [`Confinement`] resolved is canonical: a symlink there was swapped
/// in since, and is refused).
pub fn open_regular(path: &Path, follow: bool) -> Result<(File, u64), String> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
        options.custom_flags(libc::O_NONBLOCK | nofollow);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = follow;
    let file = options
        .open(path)
        .map_err(|e| format!("cannot be opened: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot be examined: {e}"))?;
    if !meta.is_file() {
        let kind = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file (a device, FIFO or socket)"
        };
        return Err(format!("is {kind}; smelt reads regular files only"));
    }
    Ok((file, meta.len()))
}

/// Reads the whole of the regular file at `path` (symlinks followed), refusing one of
/// more than `max_bytes` before reading it. The error says why, without the path (the
/// caller names the file and what it is for).
pub fn read_regular(path: &Path, max_bytes: u64) -> Result<Vec<u8>, String> {
    let (file, len) = open_regular(path, true)?;
    if len > max_bytes {
        return Err(format!(
            "is {len} bytes, more than the limit of {max_bytes} bytes for this kind of file"
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(len)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot be read: {e}"))?;
    Ok(bytes)
}

/// The folders a model's locations may resolve into: the model's own folder and, when
/// the caller names one, an allowed root. Both are canonical.
#[derive(Clone, Debug)]
pub struct Confinement {
    folder: PathBuf,
    allowed_root: Option<PathBuf>,
}

impl Confinement {
    /// Locations relative to `folder` (the model file's folder; empty means the current
    /// one), confined to it or to `allowed_root` if given. Fails if either folder cannot
    /// be resolved.
    pub fn new(folder: &Path, allowed_root: Option<&Path>) -> Result<Confinement, String> {
        let folder = if folder.as_os_str().is_empty() {
            Path::new(".")
        } else {
            folder
        };
        let canonical = |p: &Path, what: &str| {
            p.canonicalize()
                .map_err(|e| format!("{what} '{}' cannot be resolved: {e}", p.display()))
        };
        Ok(Confinement {
            folder: canonical(folder, "the model's folder")?,
            allowed_root: allowed_root
                .map(|r| canonical(r, "the allowed root"))
                .transpose()?,
        })
    }

    /// The model's folder, canonical.
    pub fn folder(&self) -> &Path {
        &self.folder
    }

    fn roots(&self) -> impl Iterator<Item = &Path> {
        std::iter::once(self.folder.as_path()).chain(self.allowed_root.as_deref())
    }

    /// Whether `p` (canonical) lies strictly inside an allowed folder.
    fn inside(&self, p: &Path) -> bool {
        self.roots().any(|r| p.starts_with(r) && p != r)
    }

    /// Whether `p` (canonical) is an allowed folder or one of its ancestors: a path the
    /// walk may pass through on its way in (an absolute location under the allowed root),
    /// and which exists, so examining it reveals nothing.
    fn on_the_way_in(&self, p: &Path) -> bool {
        self.roots().any(|r| r.starts_with(p))
    }

    /// What the refusal of a location that leads out says: the same words whatever is
    /// (or is not) there.
    fn outside(&self, location: &str, how: &str, by: &str) -> String {
        let allowed = match &self.allowed_root {
            Some(r) => format!(" or the allowed root '{}'", r.display()),
            None => String::new(),
        };
        format!(
            "'{location}' {how} the model's folder '{}'{allowed}{by}; files a model names \
             must be inside it (a caller can allow one more folder explicitly)",
            self.folder.display()
        )
    }

    /// The canonical path of `location` (relative to the model's folder, or absolute),
    /// if it resolves inside an allowed folder; no path outside is examined on the way.
    pub fn resolve(&self, location: &str) -> Result<PathBuf, String> {
        if location.is_empty() {
            return Err("the location is empty".into());
        }
        if location.contains('\0') {
            return Err(format!("'{location}' contains a NUL byte"));
        }
        let start = Path::new(location);
        if start.is_absolute() && self.allowed_root.is_none() {
            return Err(self.outside(location, "is an absolute path, outside", ""));
        }
        // a `..` that climbs out as written is refused before the file system is asked
        if self.allowed_root.is_none() {
            let mut depth = 0usize;
            for c in start.components() {
                match c {
                    Component::ParentDir if depth == 0 => {
                        return Err(self.outside(location, "climbs out of", " with '..'"))
                    }
                    Component::ParentDir => depth -= 1,
                    Component::Normal(_) => depth += 1,
                    _ => {}
                }
            }
        }
        let mut cur = if start.is_absolute() {
            PathBuf::from("/")
        } else {
            self.folder.clone()
        };
        // components still to walk, last first (a symlink's target is pushed in front)
        let mut todo: Vec<std::ffi::OsString> = Vec::new();
        let push = |todo: &mut Vec<std::ffi::OsString>, p: &Path| {
            for c in p.components().rev() {
                match c {
                    Component::Normal(n) => todo.push(n.to_owned()),
                    Component::ParentDir => todo.push("..".into()),
                    Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
                }
            }
        };
        push(&mut todo, start);
        let mut links = 0;
        while let Some(name) = todo.pop() {
            if name == ".." {
                cur.pop();
                // above an allowed folder only on the way to another one
                let within = self.inside(&cur) || self.roots().any(|r| r == cur);
                let passing = self.allowed_root.is_some() && self.on_the_way_in(&cur);
                if !(within || passing) {
                    return Err(self.outside(location, "climbs out of", " with '..'"));
                }
                continue;
            }
            let next = cur.join(&name);
            if !self.inside(&next) && !self.on_the_way_in(&next) {
                return Err(self.outside(location, "leads out of", ""));
            }
            let meta = std::fs::symlink_metadata(&next)
                .map_err(|e| format!("'{location}' cannot be opened: {e}"))?;
            if meta.file_type().is_symlink() {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(format!(
                        "'{location}' goes through more than {MAX_SYMLINKS} symlinks"
                    ));
                }
                let target = std::fs::read_link(&next)
                    .map_err(|e| format!("'{location}' cannot be opened: {e}"))?;
                if target.is_absolute() {
                    cur = PathBuf::from("/");
                }
                push(&mut todo, &target);
            } else {
                cur = next;
            }
        }
        if !self.inside(&cur) {
            return Err(self.outside(location, "does not name a file inside", ""));
        }
        Ok(cur)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_resolve_inside_the_folder_only() {
        let dir = std::env::temp_dir().join(format!("smelt-confine-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (model, outside) = (dir.join("model"), dir.join("outside"));
        std::fs::create_dir_all(model.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(model.join("w.bin"), [0u8; 8]).unwrap();
        std::fs::write(outside.join("secret.bin"), [0u8; 8]).unwrap();
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink("sub/../w.bin", model.join("alias")).unwrap();
            std::os::unix::fs::symlink("../outside/secret.bin", model.join("out")).unwrap();
            std::os::unix::fs::symlink("../outside/missing.bin", model.join("gone")).unwrap();
        }
        let c = Confinement::new(&model, None).unwrap();
        let folder = model.canonicalize().unwrap();
        assert_eq!(c.resolve("sub/../w.bin").unwrap(), folder.join("w.bin"));
        assert_eq!(c.resolve("./w.bin").unwrap(), folder.join("w.bin"));
        assert!(c
            .resolve("../outside/secret.bin")
            .unwrap_err()
            .contains("'..'"));
        assert!(c.resolve("/etc/passwd").unwrap_err().contains("absolute"));
        assert!(c.resolve("").is_err());
        assert!(c.resolve(".").is_err(), "the folder itself");
        assert!(c
            .resolve("missing.bin")
            .unwrap_err()
            .contains("cannot be opened"));
        #[cfg(unix)]
        {
            assert_eq!(c.resolve("alias").unwrap(), folder.join("w.bin"));
            // an outside file that exists and one that does not: the same words
            let (e1, e2) = (
                c.resolve("out").unwrap_err(),
                c.resolve("gone").unwrap_err(),
            );
            assert_eq!(e1.replace("'out'", "'gone'"), e2);
            let allowed = Confinement::new(&model, Some(&outside)).unwrap();
            let secret = outside.canonicalize().unwrap().join("secret.bin");
            assert_eq!(allowed.resolve("out").unwrap(), secret);
            assert_eq!(allowed.resolve(secret.to_str().unwrap()).unwrap(), secret);
        }
        assert!(open_regular(&folder, true)
            .unwrap_err()
            .contains("directory"));
        #[cfg(unix)]
        assert!(read_regular(Path::new("/dev/zero"), 1 << 20)
            .unwrap_err()
            .contains("not a regular file"));
        assert!(read_regular(&folder.join("w.bin"), 4)
            .unwrap_err()
            .contains("limit"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
