//! Backup files of logged vRegions (`replication = "log"`, LegoOS section 4.7): the logger
//! mComponent of each vRegion streams its log of write-backs here, and this appends it to one
//! file per vRegion and process. A logger made primary reads the file back and replays it.
//!
//! A file is a sequence of records, each a 17-byte header (kind, two little-endian u64) and,
//! for a page, its sealed bytes. A record cut short at the end (the sComponent stopped during
//! an append) ends the file. The file grows with every write-back; once it is more than twice
//! what it held after its last compaction (plus [`COMPACT_SLACK`]), it is rewritten with only
//! the last content of each page, so its size stays bounded by the vRegion's, whatever the
//! number of write-backs.
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_bytes::ByteBuf;
use splitos_rpc::{replay_log as replay, LogFile, LogRecord, SEALED_PAGE};

use super::ns::{vnode_key, FsResult};

const PAGE_RECORD: u8 = 1;
const DISCARD_RECORD: u8 = 2;
const HEADER: usize = 17;

/// Growth allowed past twice a file's compacted size before it is compacted again.
const COMPACT_SLACK: u64 = 64 << 20;

/// Records per read reply, well inside a frame.
pub const READ_BATCH: u32 = 64;

pub struct BackupFiles {
    dir: PathBuf,
    /// What is known of each file touched since the sComponent started; its lock also
    /// serializes the operations on files (appends from several loggers, compaction).
    files: Mutex<HashMap<PathBuf, FileState>>,
}

#[derive(Clone, Copy, Default)]
struct FileState {
    /// Its size after its last compaction.
    compacted: u64,
    /// The epoch of its last reset (or copy), also kept beside it (`.epoch`): older appends
    /// are refused, after a restart too.
    epoch: u64,
}

/// Why an append was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    Errno(i32),
    /// The file was reset at a newer epoch than the append's.
    Stale(u64),
}

fn io(e: std::io::Error) -> i32 {
    tracing::error!(error = %e, "backup file error");
    e.raw_os_error().unwrap_or(libc::EIO)
}

fn encode(r: &LogRecord, out: &mut impl Write) -> std::io::Result<()> {
    let (kind, a, b, data): (u8, u64, u64, &[u8]) = match r {
        LogRecord::Page { vpn, data } => (PAGE_RECORD, *vpn, data.len() as u64, data),
        LogRecord::Discard { start, end } => (DISCARD_RECORD, *start, *end, &[]),
    };
    let mut h = [0u8; HEADER];
    h[0] = kind;
    h[1..9].copy_from_slice(&a.to_le_bytes());
    h[9..17].copy_from_slice(&b.to_le_bytes());
    out.write_all(&h)?;
    out.write_all(data)
}

/// The next record, `None` at the end (or a record cut short there).
fn decode(r: &mut impl Read) -> std::io::Result<Option<(LogRecord, u64)>> {
    let mut h = [0u8; HEADER];
    match r.read_exact(&mut h) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let a = u64::from_le_bytes(h[1..9].try_into().expect("8 bytes"));
    let b = u64::from_le_bytes(h[9..17].try_into().expect("8 bytes"));
    match h[0] {
        PAGE_RECORD if b == SEALED_PAGE as u64 => {
            let mut data = vec![0u8; SEALED_PAGE];
            match r.read_exact(&mut data) {
                Ok(()) => Ok(Some((
                    LogRecord::Page {
                        vpn: a,
                        data: ByteBuf::from(data),
                    },
                    (HEADER + SEALED_PAGE) as u64,
                ))),
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(None),
                Err(e) => Err(e),
            }
        }
        DISCARD_RECORD if a <= b => Ok(Some((LogRecord::Discard { start: a, end: b }, HEADER as u64))),
        k => Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("backup file record of kind {k} and length {b}: the file is corrupted"),
        )),
    }
}

/// A record must be one that [`decode`] reads back.
fn check(r: &LogRecord) -> FsResult<()> {
    match r {
        LogRecord::Page { data, .. } if data.len() != SEALED_PAGE => Err(libc::EINVAL),
        LogRecord::Discard { start, end } if start > end => Err(libc::EINVAL),
        _ => Ok(()),
    }
}

impl BackupFiles {
    pub fn open(dir: &Path) -> std::io::Result<BackupFiles> {
        let dir = dir.join("backup-logs");
        std::fs::create_dir_all(&dir)?;
        Ok(BackupFiles {
            dir,
            files: Mutex::new(HashMap::new()),
        })
    }

    fn prefix(vnode: &str, pid: u64) -> FsResult<String> {
        Ok(format!("{}.{pid}.", vnode_key(vnode)?))
    }

    fn path(&self, f: &LogFile) -> FsResult<PathBuf> {
        Ok(self
            .dir
            .join(format!("{}{}.log", BackupFiles::prefix(&f.vnode, f.pid)?, f.index)))
    }

    /// The state of file `path`, read from disk the first time it is touched: a record cut
    /// short at its end (the sComponent stopped during an append) is cut off, so that the
    /// next append starts at a record's boundary.
    fn state<'a>(&self, files: &'a mut HashMap<PathBuf, FileState>, path: &Path) -> std::io::Result<&'a mut FileState> {
        if !files.contains_key(path) {
            let epoch = std::fs::read(path.with_extension("epoch"))
                .ok()
                .and_then(|b| Some(u64::from_le_bytes(b.try_into().ok()?)))
                .unwrap_or(0);
            let whole = match File::open(path) {
                Ok(f) => {
                    let mut r = BufReader::new(f);
                    let mut at = 0;
                    while let Some((_, len)) = decode(&mut r)? {
                        at += len;
                    }
                    Some(at)
                }
                Err(e) if e.kind() == ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            };
            if let Some(at) = whole {
                if std::fs::metadata(path)?.len() > at {
                    tracing::warn!(file = %path.display(), at, "backup file ends in a record cut short: cut off");
                    OpenOptions::new().write(true).open(path)?.set_len(at)?;
                }
            }
            files.insert(
                path.to_path_buf(),
                FileState {
                    compacted: whole.unwrap_or(0),
                    epoch,
                },
            );
        }
        Ok(files.get_mut(path).expect("just made"))
    }

    fn set_epoch(path: &Path, st: &mut FileState, epoch: u64) -> std::io::Result<()> {
        st.epoch = epoch;
        std::fs::write(path.with_extension("epoch"), epoch.to_le_bytes())
    }

    /// Appends `records` (to an emptied file if `reset`) logged at `epoch`; returns the bytes
    /// written.
    pub fn append(&self, f: &LogFile, epoch: u64, reset: bool, records: &[LogRecord]) -> Result<u64, Refused> {
        records.iter().try_for_each(check).map_err(Refused::Errno)?;
        let path = self.path(f).map_err(Refused::Errno)?;
        let mut files = self.files.lock().unwrap();
        let st = self.state(&mut files, &path).map_err(|e| Refused::Errno(io(e)))?;
        if epoch < st.epoch {
            return Err(Refused::Stale(st.epoch));
        }
        if reset {
            BackupFiles::set_epoch(&path, st, epoch).map_err(|e| Refused::Errno(io(e)))?;
            st.compacted = 0;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(!reset)
            .write(true)
            .truncate(reset)
            .open(&path)
            .map_err(|e| Refused::Errno(io(e)))?;
        let mut w = BufWriter::new(file);
        for r in records {
            encode(r, &mut w).map_err(|e| Refused::Errno(io(e)))?;
        }
        let file = w.into_inner().map_err(|e| Refused::Errno(io(e.into_error())))?;
        let len = file.metadata().map_err(|e| Refused::Errno(io(e)))?.len();
        if len > 2 * st.compacted + COMPACT_SLACK {
            st.compacted = self.compact(&path).map_err(|e| Refused::Errno(io(e)))?;
            crate::series::BACKUP_COMPACTIONS.increment(1);
        }
        Ok(records
            .iter()
            .map(|r| match r {
                LogRecord::Page { .. } => (HEADER + SEALED_PAGE) as u64,
                LogRecord::Discard { .. } => HEADER as u64,
            })
            .sum())
    }

    /// Rewrites a file with the last content of each page; returns its new size.
    fn compact(&self, path: &Path) -> std::io::Result<u64> {
        let mut pages = BTreeMap::new();
        let mut r = BufReader::new(File::open(path)?);
        let mut records = Vec::new();
        while let Some((rec, _)) = decode(&mut r)? {
            records.push(rec);
            if records.len() >= 1024 {
                replay(records.drain(..), &mut pages);
            }
        }
        replay(records, &mut pages);
        let tmp = path.with_extension("compacting");
        let mut w = BufWriter::new(File::create(&tmp)?);
        for (vpn, data) in pages {
            encode(&LogRecord::Page { vpn, data }, &mut w)?;
        }
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(std::fs::metadata(path)?.len())
    }

    /// Up to `max` records from byte `offset` on: (records, next offset, more).
    pub fn read(&self, f: &LogFile, offset: u64, max: u32) -> FsResult<(Vec<LogRecord>, u64, bool)> {
        let path = self.path(f)?;
        let mut files = self.files.lock().unwrap();
        self.state(&mut files, &path).map_err(io)?;
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(libc::ENOENT),
            Err(e) => return Err(io(e)),
        };
        file.seek(SeekFrom::Start(offset)).map_err(io)?;
        let mut r = BufReader::new(file);
        let (mut out, mut next) = (Vec::new(), offset);
        while out.len() < max.min(READ_BATCH) as usize {
            match decode(&mut r).map_err(io)? {
                Some((rec, len)) => {
                    out.push(rec);
                    next += len;
                }
                None => return Ok((out, next, false)),
            }
        }
        let more = decode(&mut r).map_err(io)?.is_some();
        Ok((out, next, more))
    }

    /// `to` becomes a copy of `from` at `epoch`, as a reset of `to` would.
    pub fn copy(&self, from: &LogFile, to: &LogFile, epoch: u64) -> Result<(), Refused> {
        let (src, dst) = (
            self.path(from).map_err(Refused::Errno)?,
            self.path(to).map_err(Refused::Errno)?,
        );
        if src == dst {
            return Err(Refused::Errno(libc::EINVAL));
        }
        let mut files = self.files.lock().unwrap();
        self.state(&mut files, &src).map_err(|e| Refused::Errno(io(e)))?;
        let st = self.state(&mut files, &dst).map_err(|e| Refused::Errno(io(e)))?;
        if epoch < st.epoch {
            return Err(Refused::Stale(st.epoch));
        }
        BackupFiles::set_epoch(&dst, st, epoch).map_err(|e| Refused::Errno(io(e)))?;
        let len = match std::fs::copy(&src, &dst) {
            Ok(len) => len,
            // Nothing logged yet: the copy is empty too.
            Err(e) if e.kind() == ErrorKind::NotFound => {
                File::create(&dst).map(|_| 0).map_err(|e| Refused::Errno(io(e)))?
            }
            Err(e) => return Err(Refused::Errno(io(e))),
        };
        // Compacted as far as its source may be: compacted again after as much growth.
        st.compacted = len / 2;
        Ok(())
    }

    pub fn drop_process(&self, vnode: &str, pid: u64) -> FsResult<u64> {
        let prefix = BackupFiles::prefix(vnode, pid)?;
        let mut files = self.files.lock().unwrap();
        let mut n = 0;
        for e in std::fs::read_dir(&self.dir).map_err(io)? {
            let e = e.map_err(io)?;
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                std::fs::remove_file(e.path()).map_err(io)?;
                files.remove(&e.path());
                n += 1;
            }
        }
        Ok(n)
    }

    /// Bytes of all backup files.
    pub fn bytes(&self) -> u64 {
        std::fs::read_dir(&self.dir)
            .map(|d| d.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(b: u8) -> ByteBuf {
        ByteBuf::from(vec![b; SEALED_PAGE])
    }

    fn all(b: &BackupFiles, f: &LogFile) -> Vec<LogRecord> {
        let (mut out, mut at) = (Vec::new(), 0);
        loop {
            let (recs, next, more) = b.read(f, at, 7).unwrap();
            out.extend(recs);
            at = next;
            if !more {
                return out;
            }
        }
    }

    #[test]
    fn records_read_back_in_order_a_reset_empties_and_a_torn_tail_ends_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let b = BackupFiles::open(dir.path()).unwrap();
        let f = LogFile {
            vnode: "v/../x".into(),
            pid: 7,
            index: 2,
        };
        let recs: Vec<LogRecord> = (0..20)
            .map(|i| {
                if i % 5 == 4 {
                    LogRecord::Discard { start: i, end: i + 3 }
                } else {
                    LogRecord::Page {
                        vpn: i,
                        data: page(i as u8),
                    }
                }
            })
            .collect();
        b.append(&f, 1, false, &recs[..10]).unwrap();
        b.append(&f, 1, false, &recs[10..]).unwrap();
        assert_eq!(all(&b, &f), recs);
        let path = b.path(&f).unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 10)
            .unwrap();
        assert_eq!(all(&b, &f), recs[..recs.len() - 1]);
        b.append(&f, 3, true, &recs[3..4]).unwrap();
        assert_eq!(all(&b, &f), recs[3..4]);
        assert_eq!(
            b.append(&f, 2, false, &recs[5..6]),
            Err(Refused::Stale(3)),
            "a replaced logger cannot write over the new one's backup"
        );
        assert_eq!(all(&b, &f), recs[3..4]);
        assert_eq!(
            b.append(
                &f,
                3,
                false,
                &[LogRecord::Page {
                    vpn: 1,
                    data: ByteBuf::from(vec![0; 10])
                }]
            ),
            Err(Refused::Errno(libc::EINVAL))
        );
        assert_eq!(
            b.read(&LogFile { index: 3, ..f.clone() }, 0, 10).unwrap_err(),
            libc::ENOENT
        );
        // After a restart: the epoch holds, and a record cut short is cut off before the
        // next append, which then starts at a record's boundary.
        let len = std::fs::metadata(&path).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        let again = BackupFiles::open(dir.path()).unwrap();
        assert_eq!(again.append(&f, 2, false, &recs[6..7]), Err(Refused::Stale(3)));
        again.append(&f, 3, false, &recs[6..7]).unwrap();
        assert_eq!(all(&again, &f), recs[6..7]);
    }

    #[test]
    fn compaction_keeps_the_last_content_of_each_page_and_bounds_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let b = BackupFiles::open(dir.path()).unwrap();
        let f = LogFile {
            vnode: "v".into(),
            pid: 1,
            index: 0,
        };
        // 10 pages written again and again, then half of them discarded: far more than
        // COMPACT_SLACK appended in all.
        let rounds = (3 * COMPACT_SLACK / (10 * (HEADER + SEALED_PAGE) as u64)) as u8;
        for round in 0..rounds {
            let recs: Vec<LogRecord> = (0..10)
                .map(|v| LogRecord::Page {
                    vpn: v,
                    data: page(round.wrapping_add(v as u8)),
                })
                .collect();
            b.append(&f, 1, false, &recs).unwrap();
        }
        b.append(&f, 1, false, &[LogRecord::Discard { start: 5, end: 10 }])
            .unwrap();
        assert!(std::fs::metadata(b.path(&f).unwrap()).unwrap().len() < COMPACT_SLACK + 1024 * 1024);
        let mut pages = BTreeMap::new();
        replay(all(&b, &f), &mut pages);
        let want: BTreeMap<u64, ByteBuf> = (0..5).map(|v| (v, page((rounds - 1).wrapping_add(v as u8)))).collect();
        assert_eq!(pages, want);
        let child = LogFile { pid: 2, ..f.clone() };
        b.copy(&f, &child, 1).unwrap();
        assert_eq!(
            b.copy(&f, &f, 1),
            Err(Refused::Errno(libc::EINVAL)),
            "a file is not copied onto itself"
        );
        assert_eq!(all(&b, &child), all(&b, &f));
        assert!(b.drop_process("v", 1).unwrap() >= 1);
        assert_eq!(b.read(&f, 0, 1).unwrap_err(), libc::ENOENT);
        let mut kept = BTreeMap::new();
        replay(all(&b, &child), &mut kept);
        assert_eq!(kept, want, "the child's copy outlives its parent's file");
    }
}
