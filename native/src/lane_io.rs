//! Blocking reads and writes on the proxy's non-blocking sockets, for `fetch_lane`: each waits with poll(2) on
//! the socket and on a stop descriptor (the proxy's way to end a lane at once), with a deadline.

use std::time::Instant;

/// Why a lane's I/O ended early.
pub enum End {
    /// The stop descriptor became readable: the proxy ends the lane (its connection closes).
    Stopped,
    /// The deadline passed before the socket was ready.
    Timeout,
    /// The peer closed its end (no byte of a new frame was read).
    Closed,
    /// The peer reset the connection or is gone (a write to it: EPIPE, ECONNRESET).
    Reset,
    /// The peer closed, or the socket failed, inside a frame.
    Failed(String),
}

/// Waits until `fd` is ready for `events` (POLLIN / POLLOUT), the stop descriptor is readable, or `deadline`.
fn wait(fd: i32, events: i16, stop: i32, deadline: Option<Instant>) -> Result<(), End> {
    loop {
        let timeout = match deadline {
            None => -1,
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(End::Timeout);
                }
                left.as_millis().clamp(1, i32::MAX as u128) as i32
            }
        };
        let mut fds = [
            libc::pollfd { fd, events, revents: 0 },
            libc::pollfd { fd: stop, events: libc::POLLIN, revents: 0 },
        ];
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(End::Failed(format!("poll: {err}")));
        }
        if fds[1].revents != 0 {
            return Err(End::Stopped);
        }
        if fds[0].revents != 0 {
            return Ok(()); // ready, or an error/hang-up the next call reports
        }
    }
}

/// Reads into `buf` until it is full. `first`: the wait for the first byte ends at `first` (then `Timeout`, nothing
/// read); the rest, and the first byte where `first` is None, must come by `rest` (else `Failed`). A peer that closes
/// before the first byte is `Closed`.
pub fn read_exact(fd: i32, buf: &mut [u8], stop: i32, first: Option<Instant>, rest: Instant) -> Result<(), End> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = unsafe {
            libc::recv(fd, buf[filled..].as_mut_ptr() as *mut libc::c_void, buf.len() - filled, 0)
        };
        if n > 0 {
            filled += n as usize;
            continue;
        }
        if n == 0 {
            return Err(if filled == 0 { End::Closed } else { End::Failed("closed inside a frame".into()) });
        }
        let err = std::io::Error::last_os_error();
        if gone(&err) {
            return Err(End::Reset);
        }
        match err.kind() {
            std::io::ErrorKind::WouldBlock => {
                let deadline = if filled == 0 { first.unwrap_or(rest) } else { rest };
                match wait(fd, libc::POLLIN, stop, Some(deadline)) {
                    Err(End::Timeout) if filled > 0 || first.is_none() => {
                        return Err(End::Failed("stopped sending inside a frame".into()))
                    }
                    other => other?,
                }
            }
            std::io::ErrorKind::Interrupted => {}
            _ => return Err(End::Failed(format!("recv: {err}"))),
        }
    }
    Ok(())
}

/// The first four bytes waiting in the socket (a frame's size prefix), left there; None where no byte came by `first`.
/// Bytes that began to arrive must make four by `rest`.
pub fn peek_size(fd: i32, stop: i32, first: Instant, rest: Instant) -> Result<Option<[u8; 4]>, End> {
    let mut head = [0u8; 4];
    loop {
        let n = unsafe { libc::recv(fd, head.as_mut_ptr() as *mut libc::c_void, 4, libc::MSG_PEEK) };
        if n == 4 {
            return Ok(Some(head));
        }
        if n == 0 {
            return Err(End::Closed);
        }
        if n > 0 {
            // part of a size prefix: the rest is on its way (a TCP segment of fewer than four bytes is rare)
            if Instant::now() > rest {
                return Err(End::Failed("stopped sending inside a frame".into()));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
            continue;
        }
        let err = std::io::Error::last_os_error();
        match err.kind() {
            std::io::ErrorKind::WouldBlock => match wait(fd, libc::POLLIN, stop, Some(first)) {
                Err(End::Timeout) => return Ok(None),
                other => other?,
            },
            std::io::ErrorKind::Interrupted => {}
            _ => return Err(End::Failed(format!("recv: {err}"))),
        }
    }
}

/// Writes all of `buf` by `deadline` (a peer that takes nothing until then: `Timeout`).
pub fn write_all(fd: i32, buf: &[u8], stop: i32, deadline: Instant) -> Result<(), End> {
    write_pieces(fd, &[buf], stop, deadline)
}

/// Writes all of `pieces`, in order, by `deadline`: one writev(2) for as many as the socket takes at once, so a
/// frame of a small header and its records goes out without a copy and without a segment of its own per piece.
pub fn write_pieces(fd: i32, pieces: &[&[u8]], stop: i32, deadline: Instant) -> Result<(), End> {
    let (mut first, mut offset) = (0usize, 0usize); // the first piece not wholly sent, and how much of it was
    while first < pieces.len() {
        let iov: Vec<libc::iovec> = pieces[first..]
            .iter()
            .enumerate()
            .take(64) // well under IOV_MAX
            .map(|(i, p)| {
                let p = if i == 0 { &p[offset..] } else { p };
                libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() }
            })
            .collect();
        let msg = libc::msghdr {
            msg_name: std::ptr::null_mut(),
            msg_namelen: 0,
            msg_iov: iov.as_ptr() as *mut libc::iovec,
            msg_iovlen: iov.len() as _,
            msg_control: std::ptr::null_mut(),
            msg_controllen: 0,
            msg_flags: 0,
        };
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            let mut sent = n as usize;
            while first < pieces.len() && sent >= pieces[first].len() - offset {
                sent -= pieces[first].len() - offset;
                first += 1;
                offset = 0;
            }
            offset += sent;
            continue;
        }
        let err = std::io::Error::last_os_error();
        if gone(&err) {
            return Err(End::Reset);
        }
        match err.kind() {
            std::io::ErrorKind::WouldBlock => wait(fd, libc::POLLOUT, stop, Some(deadline))?,
            std::io::ErrorKind::Interrupted => {}
            _ => return Err(End::Failed(format!("sendmsg: {err}"))),
        }
    }
    Ok(())
}

/// The peer reset the connection, or closed it under a write.
fn gone(err: &std::io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::EPIPE) | Some(libc::ECONNRESET))
}
