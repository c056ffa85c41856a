//! Messages on the socket: receiving one (header, descriptors, payload) and writing one, with
//! the descriptors a reply carries.

use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::state::{Pending, Reply, ServerError};
use super::{MAX_MSG_FDS, MAX_MSG_SIZE};
use crate::proto::{Header, HEADER_LEN};

/// Receives one message: its header, the file descriptors that came with it, and its payload.
pub(super) fn recv_message(stream: &mut UnixStream) -> Result<Pending, ServerError> {
    let mut payload = Vec::new();
    let (head, fds) = recv_message_into(stream, &mut payload)?;
    Ok(Pending { head, payload, fds })
}

/// Receives one message into `payload` (its capacity kept from call to call).
pub(crate) fn recv_message_into(
    stream: &mut UnixStream,
    payload: &mut Vec<u8>,
) -> Result<(Header, Vec<File>), ServerError> {
    let (head, fds) = recv_header(stream)?;
    let head = Header::parse(&head, MAX_MSG_SIZE)?;
    payload.clear();
    payload.resize(head.payload_len(), 0);
    stream.read_exact(payload)?;
    Ok((head, fds))
}

/// Receives exactly one header and the file descriptors that came with it.
fn recv_header(stream: &mut UnixStream) -> io::Result<([u8; HEADER_LEN], Vec<File>)> {
    let mut head = [0u8; HEADER_LEN];
    let mut raw: [RawFd; MAX_MSG_FDS] = [-1; MAX_MSG_FDS];
    let mut iov = [libc::iovec {
        iov_base: head.as_mut_ptr().cast(),
        iov_len: HEADER_LEN,
    }];
    // SAFETY: the iovec points at `head`, which is borrowed mutably for this call and is
    // HEADER_LEN bytes long; the kernel writes at most that many bytes into it.
    let (n, nfds) = unsafe { stream.recv_with_fds(&mut iov, &mut raw) }
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    let fds = raw[..nfds.min(MAX_MSG_FDS)]
        .iter()
        // SAFETY: each of the first `nfds` descriptors was just received with SCM_RIGHTS and is
        // owned by nobody else; wrapping it in a File makes it closed exactly once.
        .map(|&fd| unsafe { File::from_raw_fd(fd) })
        .collect();
    if n == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    if n < HEADER_LEN {
        stream.read_exact(&mut head[n..])?;
    }
    Ok((head, fds))
}

/// Writes one message (header and payload) with vectored writes, without joining them first.
pub(crate) fn write_message(stream: &mut UnixStream, h: Header, payload: &[u8]) -> io::Result<()> {
    let head = h.to_bytes();
    let mut parts = [&head[..], payload];
    while !parts[0].is_empty() || !parts[1].is_empty() {
        let n = match stream.write_vectored(&[IoSlice::new(parts[0]), IoSlice::new(parts[1])]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let first = n.min(parts[0].len());
        parts[0] = &parts[0][first..];
        parts[1] = &parts[1][n - first..];
    }
    Ok(())
}

/// Sends the reply to `cmd`, with the descriptors the reply carries (they go with its first
/// bytes).
pub(super) fn send(stream: &mut UnixStream, cmd: Header, r: &Reply) -> io::Result<()> {
    let h = Header::reply(cmd, r.payload.len(), r.error);
    if r.fds.is_empty() || r.error.is_some() {
        return write_message(stream, h, &r.payload);
    }
    let mut msg = h.to_bytes().to_vec();
    msg.extend_from_slice(&r.payload);
    let n = stream
        .send_with_fds(&[&msg[..]], &r.fds)
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    stream.write_all(&msg[n..])
}

/// Waits up to `timeout` for `stream` to have something to read (a message, or the peer
/// closing); whether it has.
pub(super) fn readable_within(
    stream: &UnixStream,
    timeout: std::time::Duration,
) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `fd` is one valid pollfd on the stack, borrowed mutably for the call (nfds 1); the
    // descriptor is the stream's, open for as long as `stream` is borrowed.
    let n = unsafe { libc::poll(&mut fd, 1, ms) };
    match n {
        n if n < 0 => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
        0 => Ok(false),
        _ => Ok(true),
    }
}

/// Polls `stream` without sleeping until it has something to read or `limit` has passed.
pub(crate) fn poll_for_message(stream: &UnixStream, limit: std::time::Duration) -> io::Result<()> {
    let start = std::time::Instant::now();
    while !readable_within(stream, std::time::Duration::ZERO)? && start.elapsed() < limit {
        std::hint::spin_loop();
    }
    Ok(())
}
