//! What the proxy's two lanes share (`fetch_lane`: the broker's answers passed through; `remote_lane`: answers
//! from remote storage): how a run ends, what it saw, the reads of a broker answer and of a client request on the
//! lent sockets, the request key a prediction is matched by, and the run's result as Python receives it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use crate::batch::{check_header, Kind};
use crate::fetch_scan::{self, Layout, Scan, Topic};
use crate::lane_io::{peek_size, read_exact, End};

pub const FETCH: i16 = 1;

/// How a run ended, and what the proxy does next.
pub enum Exit {
    /// The client's Fetch matched and its answer is ready: run again after the bookkeeping.
    Again,
    /// A client frame for the event loop to route (why the answer asked ahead was not served).
    Request(Vec<u8>, &'static str),
    /// Nothing pending: the event loop reads the client's next request (why nothing was asked ahead or served).
    Done(&'static str),
    /// The client closed its connection between requests.
    Closed,
    /// The proxy stopped the lane.
    Stopped,
    /// The client took no answer for the idle timeout.
    Idle,
    /// Anything else: the connection is closed with this reason.
    Failed(String),
}

impl From<End> for Exit {
    fn from(end: End) -> Self {
        match end {
            End::Stopped => Exit::Stopped,
            End::Timeout => Exit::Idle,
            End::Closed | End::Reset => Exit::Failed("the peer closed the connection".into()),
            End::Failed(why) => Exit::Failed(why),
        }
    }
}

/// What one run saw, for the proxy's metrics and its view of the broker's offsets.
#[derive(Default)]
pub struct Seen {
    pub served: u64,
    pub answers: Vec<(usize, f64)>,
    pub partitions: u64,
    pub offsets: HashMap<(Vec<u8>, i32), (i64, i64, i64)>,
}

impl Seen {
    /// The broker's offsets of an answer's partitions (scanned), and their count.
    pub fn note(&mut self, scan: &Scan<'_>) {
        self.partitions += scan.partitions.len() as u64;
        for p in &scan.partitions {
            let key = (topic_bytes(&scan.topics[p.topic]).to_vec(), p.index);
            self.offsets.insert(key, (p.log_start, p.high_watermark, p.last_stable));
        }
    }
}

/// The run's result as `FetchLane.run` and `RemoteLane.run` return it: (outcome, detail, a client frame to route or
/// None, answers served from answers asked ahead, [(answer size, seconds from its request read to written)], the
/// broker's offsets seen [(topic: 16 bytes of id or name, partition, log start, high watermark, last stable)],
/// partitions answered). Outcomes: again, request, done, closed, stopped, idle, failed.
pub type RunResult<'py> =
    (&'static str, String, Option<Bound<'py, PyBytes>>, u64, Bound<'py, PyList>, Bound<'py, PyList>, u64);

pub fn run_result<'py>(py: Python<'py>, exit: Exit, seen: &Seen, version: i16) -> PyResult<RunResult<'py>> {
    let (outcome, detail, pending) = match exit {
        Exit::Again => ("again", String::new(), None),
        Exit::Request(frame, why) => ("request", why.to_string(), Some(PyBytes::new(py, &frame))),
        Exit::Done(why) => ("done", why.to_string(), None),
        Exit::Closed => ("closed", String::new(), None),
        Exit::Stopped => ("stopped", String::new(), None),
        Exit::Idle => ("idle", String::new(), None),
        Exit::Failed(why) => ("failed", why, None),
    };
    let answers = PyList::empty(py);
    for (size, seconds) in &seen.answers {
        answers.append((*size, *seconds))?;
    }
    let offsets = PyList::empty(py);
    for ((topic, partition), (log_start, high, stable)) in &seen.offsets {
        let topic = if version >= 13 {
            PyBytes::new(py, topic).into_any()
        } else {
            PyString::new(py, &String::from_utf8_lossy(topic)).into_any()
        };
        offsets.append((topic, *partition, *log_start, *high, *stable))?;
    }
    Ok((outcome, detail, pending, seen.served, answers, offsets, seen.partitions))
}

/// A connection's two sockets as lent to a lane, the stop descriptor, and the limits and times of its reads.
pub struct Sockets {
    pub client: i32,
    pub broker: i32,
    pub stop: i32,
    pub max_request: usize,
    pub max_answer: usize,
    pub max_age: Duration,
    pub frame_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Sockets {
    /// Times in seconds.
    #[allow(clippy::too_many_arguments)]
    pub fn new(client: i32, broker: i32, stop: i32, max_request: usize, max_answer: usize, max_age: f64,
               frame_timeout: f64, idle_timeout: f64) -> Self {
        Sockets {
            client,
            broker,
            stop,
            max_request,
            max_answer,
            max_age: Duration::from_secs_f64(max_age),
            frame_timeout: Duration::from_secs_f64(frame_timeout),
            idle_timeout: Duration::from_secs_f64(idle_timeout),
        }
    }

    /// The broker's next answer (correlation id `expected`) into `buf`, size prefix first.
    pub fn read_answer(&self, buf: &mut Vec<u8>, expected: i32) -> Result<(), Exit> {
        let rest = Instant::now() + self.idle_timeout;
        let mut head = [0u8; 4];
        read_exact(self.broker, &mut head, self.stop, None, rest)
            .map_err(|e| closed(e, "the broker closed the connection"))?;
        let size = i32::from_be_bytes(head);
        if size < 8 || size as usize > self.max_answer {
            return Err(Exit::Failed(format!("the broker sent a frame of {size} bytes")));
        }
        buf.clear();
        buf.extend_from_slice(&head);
        buf.resize(4 + size as usize, 0);
        read_exact(self.broker, &mut buf[4..], self.stop, None, rest)
            .map_err(|e| closed(e, "the broker closed the connection"))?;
        let got = i32_at(buf, 4);
        if got != expected {
            return Err(Exit::Failed(format!("the broker answered correlation id {got}, expected {expected}")));
        }
        Ok(())
    }

    /// The client's next frame (after its size prefix); None, with nothing read, where its first byte did not come
    /// within the max age of `asked` (when the answer asked ahead was asked); `Done("missed")`, nothing read, for a
    /// frame larger than `max_request` (the event loop reads it, within its request budget).
    pub fn read_request(&self, asked: Instant) -> Result<Option<Vec<u8>>, Exit> {
        let first = asked + self.max_age;
        let rest = Instant::now().max(first) + self.frame_timeout;
        let head = match peek_size(self.client, self.stop, first, rest) {
            Ok(Some(head)) => head,
            Ok(None) => return Ok(None),
            Err(other) => return Err(client_gone(other)),
        };
        let size = i32::from_be_bytes(head);
        if size < 0 || size as usize > self.max_request {
            // not the prediction (the size of the request it started from): left for the event loop to read
            return Err(Exit::Done("missed"));
        }
        let mut frame = vec![0u8; 4 + size as usize];
        read_exact(self.client, &mut frame, self.stop, None, Instant::now() + self.frame_timeout)
            .map_err(client_gone)?;
        frame.drain(..4);
        Ok(Some(frame))
    }
}

/// A broker-side end: the broker gone is a failure of the connection.
fn closed(end: End, why: &str) -> Exit {
    match end {
        End::Closed | End::Reset => Exit::Failed(why.into()),
        other => other.into(),
    }
}

/// A client-side end: a client that closed, reset or went away, between or inside its frames, ends the connection
/// as a client that left (the event loop's path logs a truncated frame the same way as any close).
pub fn client_gone(end: End) -> Exit {
    match end {
        End::Closed | End::Reset => Exit::Closed,
        End::Failed(why) if why.starts_with("closed inside") => Exit::Closed,
        other => other.into(),
    }
}

pub fn walk(request: &[u8], version: i16) -> Option<Layout<'_>> {
    let body = fetch_scan::request_body_start(request, version).ok()?;
    fetch_scan::layout(request, version, body).ok()
}

pub fn request_key_of(request: &[u8], version: i16) -> Option<Vec<u8>> {
    walk(request, version).filter(|l| l.forgotten == 0).map(|l| request_key(request, &l))
}

/// Whether the client's `request` is a Fetch of `version` whose key is `key`.
pub fn matches(request: &[u8], version: i16, key: &[u8]) -> bool {
    i16_at(request, 0) == FETCH && i16_at(request, 2) == version && request_key_of(request, version).is_some_and(|k| k == key)
}

/// `fetch_ahead.request_key`: the request without its correlation id, its partitions in a fixed order.
pub fn request_key(frame: &[u8], layout: &Layout<'_>) -> Vec<u8> {
    let mut entries: Vec<Vec<u8>> = layout
        .partitions
        .iter()
        .map(|at| {
            let topic = topic_bytes(&layout.topics[at.topic]);
            let mut entry = (topic.len() as u16).to_be_bytes().to_vec();
            entry.extend_from_slice(topic);
            entry.extend_from_slice(&frame[at.start..at.end]);
            entry
        })
        .collect();
    entries.sort();
    let mut key = Vec::with_capacity(frame.len() + 2 * entries.len());
    key.extend_from_slice(&frame[..4]);
    key.extend_from_slice(&frame[8..layout.topics_at]);
    for entry in entries {
        key.extend_from_slice(&entry);
    }
    key.extend_from_slice(&frame[layout.topics_end..]);
    key
}

/// `request` (walked as `layout`) with each partition found in `ends` moved to (offset, leader epoch) there: the
/// fetch offset, and `last_fetched_epoch` where the client sends one (`fetch_ahead.next_fetch`).
pub fn moved(request: &[u8], layout: &Layout<'_>, ends: &HashMap<(&[u8], i32), (i64, i32)>) -> Vec<u8> {
    let mut predicted = request.to_vec();
    for at in &layout.partitions {
        let Some(&(offset, epoch)) = ends.get(&(topic_bytes(&layout.topics[at.topic]), at.index)) else { continue };
        predicted[at.offset..at.offset + 8].copy_from_slice(&offset.to_be_bytes());
        if let Some(e) = at.epoch {
            if i32_at(&predicted, e) >= 0 {
                predicted[e..e + 4].copy_from_slice(&epoch.to_be_bytes());
            }
        }
    }
    predicted
}

/// `fetch_ahead.last_batch_end`: (the offset after the last whole batch, its leader epoch) of a partition's records.
pub fn last_batch_end(records: &[u8]) -> Option<(i64, i32)> {
    let (mut pos, mut last) = (0usize, None);
    loop {
        match check_header(records, pos, records.len()) {
            Ok(Some(h)) => {
                last = Some((h.base_offset + i64::from(h.last_offset_delta) + 1, i32_at(records, pos + 12)));
                pos += h.size();
            }
            Ok(None) => break,
            Err(bad) if bad.kind == Kind::Truncated => break, // a batch cut short: the client skips it too
            Err(_) => return None,
        }
    }
    last
}

pub fn topic_bytes<'a>(topic: &Topic<'a>) -> &'a [u8] {
    match topic {
        Topic::Id(id) => id,
        Topic::Name(name) => name.as_bytes(),
    }
}

pub fn i16_at(buf: &[u8], at: usize) -> i16 {
    buf.get(at..at + 2).map_or(-1, |b| i16::from_be_bytes(b.try_into().unwrap()))
}

pub fn i32_at(buf: &[u8], at: usize) -> i32 {
    buf.get(at..at + 4).map_or(-1, |b| i32::from_be_bytes(b.try_into().unwrap()))
}
