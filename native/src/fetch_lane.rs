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

use crate::fetch_scan::{self, Scan};
use crate::lane::{
    client_gone, i32_at, last_batch_end, matches, moved, request_key, run_result, topic_bytes, walk, Exit, RunResult,
    Seen, Sockets,
};
use crate::lane_io::write_all;
use crate::with_buffer;

const READ_COMMITTED: u8 = 1;

struct Cycle {
    io: Sockets,
    version: i16,
    fetch_max_bytes: i32,
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
                io: Sockets::new(client, broker, stop, max_request, max_answer, max_age, frame_timeout, idle_timeout),
                version,
                fetch_max_bytes,
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
        if request.len() > cycle.io.max_request
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

    /// Writes the answer given and goes on (module docs). Returns `lane::RunResult`.
    fn run<'py>(&mut self, py: Python<'py>) -> PyResult<RunResult<'py>> {
        let mut cycle = self.cycle.take().expect("a lane is not run twice at once");
        let (exit, seen, cycle) = py.detach(move || {
            let mut seen = Seen::default();
            let exit = cycle.run(&mut seen);
            (exit, seen, cycle)
        });
        let version = cycle.version;
        self.cycle = Some(cycle);
        run_result(py, exit, &seen, version)
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
            seen.note(&scan);
            let next = if self.slow { None } else { self.predict(frame, &scan)? };
            let asked = Instant::now();
            if let Some(ask) = &next {
                write_all(self.io.broker, &ask.send, self.io.stop, asked + self.io.idle_timeout)?;
            }
            write_all(self.io.client, &self.answer, self.io.stop, Instant::now() + self.io.idle_timeout)
                .map_err(client_gone)?;
            let answered = Instant::now();
            seen.answers.push((self.answer.len(), answered.duration_since(read_at).as_secs_f64()));
            let Some(Ask { send, key }) = next else {
                return Ok(Exit::Done(if self.slow { "slow" } else { "no more data waiting" }));
            };
            self.asked = asked;
            self.io.read_answer(&mut self.spare, i32_at(&send, 8))?;
            let usable_answer = usable(&self.spare[4..], v).is_some();
            let Some(request) = self.io.read_request(self.asked)? else {
                return Ok(Exit::Done("stale")); // the answer asked ahead dropped
            };
            read_at = Instant::now();
            if !matches(&request, v, &key) {
                return Ok(Exit::Request(request, "missed"));
            }
            if !usable_answer {
                return Ok(Exit::Request(request, "unusable"));
            }
            if read_at.duration_since(self.asked) > self.io.max_age {
                return Ok(Exit::Request(request, "stale"));
            }
            // Python's rule (FetchAhead.claim / wanted): a client that asks later than half the max age after its
            // answer gets nothing asked ahead after this answer
            self.slow = read_at.duration_since(answered) > self.io.max_age / 2;
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
        let predicted = moved(request, &layout, &ends);
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
