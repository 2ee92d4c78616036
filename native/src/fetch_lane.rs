//! The pass-through Fetch cycle of one client connection, run without the interpreter (`reader/proxy/lane.py`).
//!
//! A consumer reading local data through the proxy repeats one cycle: its Fetch, the broker's answer, its next
//! Fetch. With fetch ahead (`reader/proxy/fetch_ahead.py`) the proxy asks the broker for the predicted next Fetch
//! as an answer goes out, and gives the held answer when the client's Fetch is the one predicted. In Python each
//! cycle cost about 0.6 ms of the interpreter around two socket calls (docs/design.md, "The native lane"). A lane
//! runs the same cycle here on a thread of its own, the GIL released, on the connection's two sockets, and gives
//! the connection back to the event loop at the first thing it does not do itself:
//!
//! - the client's next frame is not the Fetch predicted (another request, a seek, a partition added): that frame
//!   is given back to be routed as any request (`request`), the answer asked ahead dropped;
//! - the answer asked ahead is not one to serve (an error, node endpoints, a throttle, no records): the same;
//! - it is older than `max_age` when the client asks (`stale`), or the answer shows no more data waiting, or the
//!   client came late after its last answer (`slow`): nothing is asked ahead (`done`);
//! - every `run_for`, at the moment an answer is about to be served (`again`: the proxy learns the offsets seen
//!   and counts the answers, then runs the lane on).
//!
//! What it serves is exactly what the Python path serves: the broker's answer, on the client's own connection, to
//! a request equal to the client's (the correlation id and the order of the partitions aside), at most `max_age`
//! after the broker gave it. The request asked ahead is the prediction with `max_wait` 0, `max_bytes` at most the
//! proxy's `fetch_max_bytes`, and no fetch session, as the Fetch handler sends it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use crate::batch::{check_header, Kind};
use crate::fetch_scan::{self, Layout, Scan, Topic};
use crate::lane_io::{peek_size, read_exact, write_all, End};
use crate::with_buffer;

const FETCH: i16 = 1;
const READ_COMMITTED: u8 = 1;

/// How a run ended, and what the proxy does next.
enum Exit {
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
struct Seen {
    served: u64,
    answers: Vec<(usize, f64)>,
    partitions: u64,
    offsets: HashMap<(Vec<u8>, i32), (i64, i64, i64)>,
}

struct Cycle {
    client: i32,
    broker: i32,
    stop: i32,
    version: i16,
    max_request: usize,
    max_answer: usize,
    fetch_max_bytes: i32,
    max_age: Duration,
    frame_timeout: Duration,
    idle_timeout: Duration,
    run_for: Duration,
    request: Vec<u8>,
    asked: Instant,
    answer: Vec<u8>,
    spare: Vec<u8>,
    slow: bool,
}

/// A Fetch asked ahead: the frame sent the broker (size prefix first) and the prediction's `request_key`.
struct Ask {
    send: Vec<u8>,
    key: Vec<u8>,
}

/// One connection's lane. `start` gives it the client's Fetch and its answer (the one to write next); `run` writes
/// it and goes on until an exit (module docs). Not thread-safe: the connection runs one at a time.
#[pyclass(module = "tiering_native")]
pub struct FetchLane {
    cycle: Option<Cycle>,
}

#[pymethods]
impl FetchLane {
    /// client, broker: the sockets' descriptors (non-blocking); stop: a descriptor that turns readable to end a run
    /// at once. max_request: the largest client frame the lane reads (a larger one is left to the event loop);
    /// max_answer: the largest broker frame; times in seconds.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        client: i32,
        broker: i32,
        stop: i32,
        version: i16,
        max_request: usize,
        max_answer: usize,
        fetch_max_bytes: i32,
        max_age: f64,
        frame_timeout: f64,
        idle_timeout: f64,
        run_for: f64,
    ) -> Self {
        FetchLane {
            cycle: Some(Cycle {
                client,
                broker,
                stop,
                version,
                max_request,
                max_answer,
                fetch_max_bytes,
                max_age: Duration::from_secs_f64(max_age),
                frame_timeout: Duration::from_secs_f64(frame_timeout),
                idle_timeout: Duration::from_secs_f64(idle_timeout),
                run_for: Duration::from_secs_f64(run_for),
                request: Vec::new(),
                asked: Instant::now(),
                answer: Vec::new(),
                spare: Vec::new(),
                slow: false,
            }),
        }
    }

    /// The client's Fetch `request` (its frame after the size prefix, of this lane's version) and its `answer` (the
    /// whole frame, size prefix first, under the request's correlation id). Returns the most an answer of this
    /// request can hold (its max_bytes within fetch_max_bytes, and within the sum of its partitions'), or None where
    /// the lane cannot take it: a request larger than max_request, one it cannot walk or with forgotten topics, an
    /// answer not to pass on as it is.
    fn start(&mut self, request: &Bound<'_, PyAny>, answer: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
        let cycle = self.cycle.as_mut().expect("a lane is not run twice at once");
        let version = cycle.version;
        let request = with_buffer(request, |b| b.to_vec())?;
        let answer = with_buffer(answer, |b| b.to_vec())?;
        let Ok(body) = fetch_scan::request_body_start(&request, version) else { return Ok(None) };
        let Ok(layout) = fetch_scan::layout(&request, version, body) else { return Ok(None) };
        if request.len() > cycle.max_request
            || layout.forgotten > 0
            || answer.len() < 8
            || usable(&answer[4..], version).is_none()
        {
            return Ok(None);
        }
        let max_bytes = i64::from(i32_at(&request, layout.max_wait + 8).min(cycle.fetch_max_bytes));
        let partitions: i64 = layout.partitions.iter().map(|at| i64::from(i32_at(&request, at.max_bytes).max(0))).sum();
        cycle.request = request;
        cycle.answer = answer;
        cycle.slow = false;
        Ok(Some(max_bytes.min(partitions)))
    }

    /// Writes the answer given and goes on (module docs). Returns (outcome, detail, a client frame to route or None,
    /// answers served from answers asked ahead, [(answer size, seconds from its request read to written)], the
    /// broker's offsets seen [(topic: 16 bytes of id or name, partition, log start, high watermark, last stable)],
    /// partitions passed). Outcomes: again, request, done, closed, stopped, idle, failed.
    #[allow(clippy::type_complexity)]
    fn run<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<(&'static str, String, Option<Bound<'py, PyBytes>>, u64, Bound<'py, PyList>, Bound<'py, PyList>, u64)>
    {
        let mut cycle = self.cycle.take().expect("a lane is not run twice at once");
        let (exit, seen, cycle) = py.detach(move || {
            let mut seen = Seen::default();
            let exit = cycle.run(&mut seen);
            (exit, seen, cycle)
        });
        self.cycle = Some(cycle);
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
            let topic = if self.cycle.as_ref().is_some_and(|c| c.version >= 13) {
                PyBytes::new(py, topic).into_any()
            } else {
                PyString::new(py, &String::from_utf8_lossy(topic)).into_any()
            };
            offsets.append((topic, *partition, *log_start, *high, *stable))?;
        }
        Ok((outcome, detail, pending, seen.served, answers, offsets, seen.partitions))
    }
}

impl Cycle {
    fn run(&mut self, seen: &mut Seen) -> Exit {
        match self.cycles(seen) {
            Ok(exit) | Err(exit) => exit,
        }
    }

    /// The cycle: `self.answer` answers `self.request`; ask the next ahead, write the answer, then serve the client's
    /// next Fetch from the answer asked ahead while it is the one predicted.
    fn cycles(&mut self, seen: &mut Seen) -> Result<Exit, Exit> {
        let began = Instant::now();
        let v = self.version;
        let mut read_at = Instant::now();
        loop {
            let frame = &self.answer[4..];
            let scan = usable(frame, v).ok_or_else(|| Exit::Failed("an answer to serve no longer scans".into()))?;
            note(seen, &scan);
            let next = if self.slow { None } else { self.predict(frame, &scan)? };
            let asked = Instant::now();
            if let Some(ask) = &next {
                write_all(self.broker, &ask.send, self.stop, asked + self.idle_timeout)?;
            }
            write_all(self.client, &self.answer, self.stop, Instant::now() + self.idle_timeout).map_err(client_gone)?;
            let answered = Instant::now();
            seen.answers.push((self.answer.len(), answered.duration_since(read_at).as_secs_f64()));
            let Some(Ask { send, key }) = next else {
                return Ok(Exit::Done(if self.slow { "slow" } else { "no more data waiting" }));
            };
            self.asked = asked;
            let usable_answer = self.read_answer(i32_at(&send, 8))?;
            let Some(request) = self.read_request()? else {
                return Ok(Exit::Done("stale")); // the answer asked ahead dropped
            };
            read_at = Instant::now();
            let matches = i16_at(&request, 0) == FETCH
                && i16_at(&request, 2) == v
                && request_key_of(&request, v).is_some_and(|k| k == key);
            if !matches {
                return Ok(Exit::Request(request, "missed"));
            }
            if !usable_answer {
                return Ok(Exit::Request(request, "unusable"));
            }
            if read_at.duration_since(self.asked) > self.max_age {
                return Ok(Exit::Request(request, "stale"));
            }
            // Python's rule (FetchAhead.claim / wanted): a client that asks later than half the max age after its
            // answer gets nothing asked ahead after this answer
            self.slow = read_at.duration_since(answered) > self.max_age / 2;
            seen.served += 1;
            self.spare[4..8].copy_from_slice(&request[4..8]); // the client's correlation id
            std::mem::swap(&mut self.answer, &mut self.spare);
            self.request = request;
            if began.elapsed() > self.run_for {
                return Ok(Exit::Again);
            }
        }
    }

    /// The next Fetch if the client reads on from `answer` (its frame after the size prefix) to `self.request`, as
    /// `fetch_ahead.next_fetch` predicts it; None when no partition shows more data waiting.
    fn predict(&self, answer: &[u8], scan: &Scan<'_>) -> Result<Option<Ask>, Exit> {
        let v = self.version;
        let request = &self.request;
        let layout = walk(request, v).ok_or_else(|| Exit::Failed("a request to predict from no longer walks".into()))?;
        let read_committed = request[layout.max_wait + 12] == READ_COMMITTED;
        let mut ends: HashMap<(&[u8], i32), (i64, i32)> = HashMap::new();
        let mut more = false;
        for p in &scan.partitions {
            if p.records == 0 {
                continue;
            }
            let Some(end) = last_batch_end(&answer[p.records_at..p.records_at + p.records]) else { continue };
            ends.insert((topic_bytes(&scan.topics[p.topic]), p.index), end);
            let bound = if read_committed && p.last_stable >= 0 { p.last_stable } else { p.high_watermark };
            more |= bound > end.0;
        }
        if !more {
            return Ok(None);
        }
        let mut predicted = request.clone();
        for at in &layout.partitions {
            let Some(&(offset, epoch)) = ends.get(&(topic_bytes(&layout.topics[at.topic]), at.index)) else { continue };
            predicted[at.offset..at.offset + 8].copy_from_slice(&offset.to_be_bytes());
            if let Some(e) = at.epoch {
                if i32_at(&predicted, e) >= 0 {
                    predicted[e..e + 4].copy_from_slice(&epoch.to_be_bytes());
                }
            }
        }
        let key = request_key(&predicted, &layout);
        let mut send = Vec::with_capacity(4 + predicted.len());
        send.extend_from_slice(&(predicted.len() as i32).to_be_bytes());
        send.extend_from_slice(&predicted);
        let at = 4 + layout.max_wait;
        send[at..at + 4].copy_from_slice(&0i32.to_be_bytes()); // asked only where data waits: no wait
        let max_bytes = i32_at(&send, at + 8).min(self.fetch_max_bytes);
        send[at + 8..at + 12].copy_from_slice(&max_bytes.to_be_bytes());
        if let Some(s) = layout.session {
            send[4 + s..8 + s].copy_from_slice(&0i32.to_be_bytes()); // sessionless, as every Fetch the proxy sends
            send[8 + s..12 + s].copy_from_slice(&(-1i32).to_be_bytes());
        }
        Ok(Some(Ask { send, key }))
    }

    /// The broker's answer to the Fetch asked ahead (correlation id `expected`) into `self.spare`; whether it is one
    /// to serve.
    fn read_answer(&mut self, expected: i32) -> Result<bool, Exit> {
        let rest = Instant::now() + self.idle_timeout;
        let mut head = [0u8; 4];
        read_exact(self.broker, &mut head, self.stop, None, rest)
            .map_err(|e| closed(e, "the broker closed the connection"))?;
        let size = i32::from_be_bytes(head);
        if size < 8 || size as usize > self.max_answer {
            return Err(Exit::Failed(format!("the broker sent a frame of {size} bytes")));
        }
        fill(&mut self.spare, head, size as usize);
        read_exact(self.broker, &mut self.spare[4..], self.stop, None, rest)
            .map_err(|e| closed(e, "the broker closed the connection"))?;
        let got = i32_at(&self.spare, 4);
        if got != expected {
            return Err(Exit::Failed(format!("the broker answered correlation id {got}, expected {expected}")));
        }
        Ok(usable(&self.spare[4..], self.version).is_some())
    }

    /// The client's next frame (after its size prefix); None, with nothing read, where its first byte did not come
    /// within the max age of the answer asked ahead; `Done("missed")`, nothing read, for a frame larger than
    /// `max_request` (the event loop reads it, within its request budget).
    fn read_request(&mut self) -> Result<Option<Vec<u8>>, Exit> {
        let first = self.asked + self.max_age;
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

/// `buf` holding `size` bytes after the size prefix `head` (its capacity kept from answer to answer).
fn fill(buf: &mut Vec<u8>, head: [u8; 4], size: usize) {
    buf.clear();
    buf.extend_from_slice(&head);
    buf.resize(4 + size, 0);
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
fn client_gone(end: End) -> Exit {
    match end {
        End::Closed | End::Reset => Exit::Closed,
        End::Failed(why) if why.starts_with("closed inside") => Exit::Closed,
        other => other.into(),
    }
}

/// The scan of a Fetch answer (its frame after the size prefix) that goes to the client as it is and is one to
/// serve when asked ahead (`connection._held`): no error, no node endpoints, no throttle, some records.
fn usable(frame: &[u8], version: i16) -> Option<Scan<'_>> {
    let body = fetch_scan::response_body_start(frame, version).ok()?;
    let scan = fetch_scan::scan(frame, version, body).ok()?;
    let plain = scan.error == 0 && !scan.tagged && scan.partitions.iter().all(|p| p.error == 0);
    let throttled = i32_at(frame, body) != 0;
    let records = scan.partitions.iter().any(|p| p.records > 0);
    (plain && !throttled && records).then_some(scan)
}

fn note(seen: &mut Seen, scan: &Scan<'_>) {
    seen.partitions += scan.partitions.len() as u64;
    for p in &scan.partitions {
        let key = (topic_bytes(&scan.topics[p.topic]).to_vec(), p.index);
        seen.offsets.insert(key, (p.log_start, p.high_watermark, p.last_stable));
    }
}

fn walk(request: &[u8], version: i16) -> Option<Layout<'_>> {
    let body = fetch_scan::request_body_start(request, version).ok()?;
    fetch_scan::layout(request, version, body).ok()
}

fn request_key_of(request: &[u8], version: i16) -> Option<Vec<u8>> {
    walk(request, version).filter(|l| l.forgotten == 0).map(|l| request_key(request, &l))
}

/// `fetch_ahead.request_key`: the request without its correlation id, its partitions in a fixed order.
fn request_key(frame: &[u8], layout: &Layout<'_>) -> Vec<u8> {
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

/// `fetch_ahead.last_batch_end`: (the offset after the last whole batch, its leader epoch) of a partition's records.
fn last_batch_end(records: &[u8]) -> Option<(i64, i32)> {
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

fn topic_bytes<'a>(topic: &Topic<'a>) -> &'a [u8] {
    match topic {
        Topic::Id(id) => id,
        Topic::Name(name) => name.as_bytes(),
    }
}

fn i16_at(buf: &[u8], at: usize) -> i16 {
    buf.get(at..at + 2).map_or(-1, |b| i16::from_be_bytes(b.try_into().unwrap()))
}

fn i32_at(buf: &[u8], at: usize) -> i32 {
    buf.get(at..at + 4).map_or(-1, |b| i32::from_be_bytes(b.try_into().unwrap()))
}
