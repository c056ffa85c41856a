//! The journal of `gmig vm migrate`: every byte a side sends (source) or receives (destination)
//! also goes to a file, the stream of the VM's whole state, which `--resume` replays when the
//! switch-over left this side in doubt.
//!
//! The bytes are copied into a buffer as they cross the connection and handed, a buffer at a
//! time (when it fills, and whenever the connection is flushed), to a writer thread that writes
//! them to the file: the migration's own thread never waits for the file, so the journal costs
//! the downtime one copy of the bytes, not the file's writes. A side in doubt [`Journaled::keep`]s
//! its journal: the last buffer is handed over, the writer finishes, and the file is synced
//! before the side says it holds a copy. A journal not kept is removed; its writer is told to
//! stop and is not waited for.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{anyhow, Context};

use crate::cli::JournalArg;

/// Bytes gathered before they go to the writer.
const BUFFER: usize = 1 << 20;
/// Buffers in flight to the writer at most (past that the connection waits for the file).
const IN_FLIGHT: usize = 256;

/// Where the journal's bytes go.
enum Sink {
    /// To the writer thread.
    Thread {
        pending: Vec<u8>,
        tx: Option<SyncSender<Vec<u8>>>,
        writer: Option<JoinHandle<std::io::Result<std::fs::File>>>,
        discard: Arc<AtomicBool>,
    },
    /// Straight to the file, as they cross (the way before the writer thread; for comparison).
    Inline(std::io::BufWriter<std::fs::File>),
    /// Nowhere: a side left in doubt has no copy (for measuring what the journal costs).
    Off,
}

/// The migration connection, journaled.
pub struct Journaled {
    conn: TcpStream,
    sink: Sink,
    path: PathBuf,
    reads: bool,
    keep: bool,
}

impl Journaled {
    /// Journals `conn` to `path`: what it reads (`reads`, the destination) or what it writes.
    pub fn new(
        conn: TcpStream,
        path: PathBuf,
        reads: bool,
        how: JournalArg,
    ) -> anyhow::Result<Self> {
        let file = || {
            std::fs::File::create(&path)
                .with_context(|| format!("creating the journal {}", path.display()))
        };
        let sink = match how {
            JournalArg::Thread => {
                let mut file = file()?;
                let (tx, rx) = sync_channel::<Vec<u8>>(IN_FLIGHT);
                let discard = Arc::new(AtomicBool::new(false));
                let stop = Arc::clone(&discard);
                let writer = std::thread::Builder::new()
                    .name("gmig-journal".into())
                    .spawn(move || {
                        for buf in rx {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            file.write_all(&buf)?;
                        }
                        Ok(file)
                    })
                    .context("starting the journal's writer")?;
                Sink::Thread {
                    pending: Vec::with_capacity(BUFFER),
                    tx: Some(tx),
                    writer: Some(writer),
                    discard,
                }
            }
            JournalArg::Inline => Sink::Inline(std::io::BufWriter::with_capacity(BUFFER, file()?)),
            JournalArg::Off => Sink::Off,
        };
        Ok(Journaled {
            conn,
            sink,
            path,
            reads,
            keep: false,
        })
    }

    /// Journals `data`.
    fn log(&mut self, data: &[u8]) -> std::io::Result<()> {
        match &mut self.sink {
            Sink::Thread { pending, .. } => {
                pending.extend_from_slice(data);
                if pending.len() >= BUFFER {
                    self.hand_over()?;
                }
                Ok(())
            }
            Sink::Inline(w) => w.write_all(data),
            Sink::Off => Ok(()),
        }
    }

    /// Hands the gathered bytes to the writer.
    fn hand_over(&mut self) -> std::io::Result<()> {
        if let Sink::Thread { pending, tx, .. } = &mut self.sink {
            if pending.is_empty() {
                return Ok(());
            }
            let buf = std::mem::replace(pending, Vec::with_capacity(BUFFER));
            let gone = || std::io::Error::other("the journal's writer stopped");
            tx.as_ref()
                .ok_or_else(gone)?
                .send(buf)
                .map_err(|_| gone())?;
        }
        Ok(())
    }

    /// Keeps the journal, complete and synced (this side is in doubt): returns its path.
    pub fn keep(mut self) -> anyhow::Result<PathBuf> {
        self.keep = true;
        self.hand_over()?;
        match &mut self.sink {
            Sink::Thread { tx, writer, .. } => {
                drop(tx.take());
                writer
                    .take()
                    .ok_or_else(|| anyhow!("the journal's writer is gone"))?
                    .join()
                    .map_err(|_| anyhow!("the journal's writer panicked"))??
                    .sync_all()?;
            }
            Sink::Inline(w) => {
                w.flush()?;
                w.get_ref().sync_all()?;
            }
            Sink::Off => return Err(anyhow!("no journal was written (--x-journal off)")),
        }
        Ok(self.path.clone())
    }
}

impl Drop for Journaled {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if let Sink::Thread { tx, discard, .. } = &mut self.sink {
            // Not waited for: the writer drops what is left and ends.
            discard.store(true, Ordering::Relaxed);
            drop(tx.take());
        }
        if !matches!(self.sink, Sink::Off) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Read for Journaled {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.conn.read(buf)?;
        if self.reads {
            self.log(&buf[..n])?;
        }
        Ok(n)
    }
}

impl Write for Journaled {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.conn.write(buf)?;
        if !self.reads {
            self.log(&buf[..n])?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.hand_over()?;
        self.conn.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    use super::{Journaled, BUFFER};
    use crate::cli::JournalArg;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (a, l.accept().unwrap().0)
    }

    /// What a source writes and a destination reads, kept: each journal holds exactly its
    /// side's bytes (several buffers' worth, and a last partial one never flushed); a journal
    /// not kept is removed; with `off` there is no copy to keep.
    #[test]
    fn a_kept_journal_holds_every_byte_and_one_not_kept_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3 * BUFFER + 12_345)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        for how in [JournalArg::Thread, JournalArg::Inline] {
            let (a, b) = pair();
            let (src_path, dst_path) = (dir.path().join("src"), dir.path().join("dst"));
            let mut src = Journaled::new(a, src_path.clone(), false, how).unwrap();
            let mut dst = Journaled::new(b, dst_path.clone(), true, how).unwrap();
            let sent = data.clone();
            let writer = std::thread::spawn(move || {
                src.write_all(&sent[..BUFFER + 7]).unwrap();
                src.flush().unwrap();
                src.write_all(&sent[BUFFER + 7..]).unwrap();
                src.keep().unwrap()
            });
            let mut got = vec![0u8; data.len()];
            dst.read_exact(&mut got).unwrap();
            assert_eq!(got, data);
            assert_eq!(dst.keep().unwrap(), dst_path);
            assert_eq!(writer.join().unwrap(), src_path);
            assert_eq!(std::fs::read(&src_path).unwrap(), data, "{how:?}: source");
            assert_eq!(
                std::fs::read(&dst_path).unwrap(),
                data,
                "{how:?}: destination"
            );

            let (a, _b) = pair();
            let gone = dir.path().join("gone");
            let mut j = Journaled::new(a, gone.clone(), false, how).unwrap();
            j.write_all(&data).unwrap();
            drop(j);
            assert!(!gone.exists(), "{how:?}: a journal not kept was left");
        }
        let (a, _b) = pair();
        let mut off = Journaled::new(a, dir.path().join("off"), false, JournalArg::Off).unwrap();
        off.write_all(&data[..100]).unwrap();
        assert!(off.keep().is_err(), "--x-journal off kept a copy");
    }
}
