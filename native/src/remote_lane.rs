//! The remote Fetch cycle of one client connection, run without the interpreter (`reader/proxy/remote_lane.py`).
//!
//! A consumer catching up from remote storage through the proxy repeats one cycle: its Fetch, a probe the proxy
//! sends the broker for it (the same partitions at the broker's high watermark with no room for records: the
//! broker authorises and leads them, `reader/proxy/fetch.py`), the answer built from remote batches with the
//! probe's offsets, its next Fetch. In Python each cycle cost about 1.2 ms of the interpreter per answer beside
//! the two socket copies (docs/design.md, "The remote lane"). Here the proxy hands the lane, ahead, the batches of
//! the answers the client will ask next (each a list of records per partition, read by the read core in the order a
//! sequential client reads them), and the lane runs the cycle on a thread of its own with the GIL released:
//!
//! - it sends the probe for the next answer, then writes the answer due (a few bytes of header and the batches as
//!   pieces of one gathered write: the batches are never copied in user space);
//! - it reads the broker's answer to the probe, and the client's next Fetch;
//! - when that Fetch is the one predicted (`fetch_ahead.request_key`: the last one with each partition moved past
//!   the batches it was given) and the probe's answer allows every partition (no error, no throttle, no node
//!   endpoints), it builds the next answer: the batches handed for it, the probe's high watermark and last stable
//!   offset, the remote start as log start (as `FetchPlan.merge` answers a remote partition).
//!
//! Anything else gives the connection back, with the client's frame for the handlers where there is one, so the
//! broker still decides every answer: a refused probe (an ACL revoked, a leader moved) means the client's request
//! goes to the broker through the Python path, which answers with the broker's error. The lane also comes back
//! when the answers handed run out (`again` with none queued: the proxy hands more, or lets it write the last and
//! end) and every `run_for` (metrics, the broker's offsets).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::fetch_scan::{self, Scan};
use crate::lane::{
    client_gone, i32_at, last_batch_end, matches, moved, request_key, run_result, topic_bytes, walk, Exit, RunResult,
    Seen, Sockets,
};
use crate::lane_io::{write_all, write_pieces};

/// A Python byte buffer held while the lane may read it (batches of a window, immutable `bytes`; an answer's
/// pieces, which the proxy does not change once made).
struct Held(PyBuffer<u8>);

impl Held {
    fn get(obj: &Bound<'_, PyAny>) -> PyResult<Held> {
        let buffer = PyBuffer::<u8>::get(obj)?;
        if !buffer.is_c_contiguous() {
            return Err(PyValueError::new_err("a C-contiguous byte buffer is required"));
        }
        Ok(Held(buffer))
    }

    fn bytes(&self) -> &[u8] {
        // The exporter keeps the memory alive and unmoved while the buffer is held.
        unsafe { std::slice::from_raw_parts(self.0.buf_ptr() as *const u8, self.0.len_bytes()) }
    }
}

/// A piece of an answer to write: bytes of the lane's own, or a buffer handed by Python.
enum Piece {
    Own(Vec<u8>),
    Handed(Arc<Held>),
}

impl Piece {
    fn bytes(&self) -> &[u8] {
        match self {
            Piece::Own(b) => b,
            Piece::Handed(h) => h.bytes(),
        }
    }
}

/// Each partition's aborted transactions overlapping its batches, as (producer id, first offset); None: the
/// request reads uncommitted (the answer's list is null).
type Aborted = Vec<Option<Vec<(i64, i64)>>>;

/// One answer handed ahead: the request it answers (its key), each partition's batches and aborted transactions.
struct Entry {
    key: Vec<u8>,
    records: Vec<Option<Arc<Held>>>,
    aborted: Aborted,
}

/// A partition of the requests, in the order of the answers: its topic (16 bytes of id, or the name), index and
/// the remote start (the answers' log start).
struct Part {
    topic: Vec<u8>,
    index: i32,
    log_start: i64,
}

struct Cycle {
    io: Sockets,
    version: i16,
    run_for: Duration,
    parts: Vec<Part>,
    probe: Vec<u8>,
    probe_offsets: Vec<usize>, // where each part's fetch offset is in `probe` (size prefix included)
    probe_answer: Vec<u8>,
    answer: Vec<Piece>,   // the answer due
    request: Vec<u8>,     // the last request handed (the latest answer handed answers it)
    last: Vec<Option<Arc<Held>>>, // the latest answer's batches handed (the next request is predicted from them)
    queue: std::collections::VecDeque<Entry>,
    spent: Vec<Piece>, // pieces written, dropped once the run is back with the GIL
    trash: Vec<Arc<Held>>, // the batches of answers taken from the queue: the same (a buffer is let go with the GIL)
    last_answer: bool, // no more answers will be handed: write the one due and end
}

/// One connection's remote lane (module docs). Not thread-safe: the connection runs one at a time.
#[pyclass(module = "tiering_native")]
pub struct RemoteLane {
    cycle: Option<Cycle>,
}

#[pymethods]
impl RemoteLane {
    /// As `FetchLane`: the sockets' descriptors (non-blocking), a stop descriptor, the largest client frame read and
    /// broker frame accepted, times in seconds.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        client: i32,
        broker: i32,
        stop: i32,
        version: i16,
        max_request: usize,
        max_answer: usize,
        max_age: f64,
        frame_timeout: f64,
        idle_timeout: f64,
        run_for: f64,
    ) -> Self {
        RemoteLane {
            cycle: Some(Cycle {
                io: Sockets::new(client, broker, stop, max_request, max_answer, max_age, frame_timeout, idle_timeout),
                version,
                run_for: Duration::from_secs_f64(run_for),
                parts: Vec::new(),
                probe: Vec::new(),
                probe_offsets: Vec::new(),
                probe_answer: Vec::new(),
                answer: Vec::new(),
                request: Vec::new(),
                last: Vec::new(),
                queue: Default::default(),
                spent: Vec::new(),
                trash: Vec::new(),
                last_answer: false,
            }),
        }
    }

    /// The client's Fetch `request` (after the size prefix) whose `answer` is due (its pieces, size prefix first,
    /// under the request's correlation id), the `probe` to send the broker before each next answer (size prefix
    /// first: the proxy's probe of the request's partitions, `FetchPlan`), the request's `partitions` as
    /// [(topic, index, remote start)] in the order answers list them (grouped by topic), and the batches the due
    /// answer gives each (`records`, in that order; None: none). False where the lane cannot take it: a request
    /// it cannot walk, with forgotten topics, larger than max_request, or whose partitions are not those given; a
    /// probe of other partitions.
    fn start(
        &mut self,
        request: Vec<u8>,
        answer: &Bound<'_, PyList>,
        probe: Vec<u8>,
        partitions: Vec<(Vec<u8>, i32, i64)>,
        records: &Bound<'_, PyList>,
    ) -> PyResult<bool> {
        let cycle = self.cycle.as_mut().expect("a lane is not run twice at once");
        let v = cycle.version;
        let parts: Vec<Part> =
            partitions.into_iter().map(|(topic, index, log_start)| Part { topic, index, log_start }).collect();
        let Some(layout) = walk(&request, v) else { return Ok(false) };
        if request.len() > cycle.io.max_request || layout.forgotten > 0 || !same_partitions(&layout, &parts) {
            return Ok(false);
        }
        let Some(probe_layout) = (probe.len() > 4).then(|| walk(&probe[4..], v)).flatten() else { return Ok(false) };
        if !same_partitions(&probe_layout, &parts) {
            return Ok(false);
        }
        let mut probe_offsets = Vec::with_capacity(parts.len());
        for part in &parts {
            let at = probe_layout
                .partitions
                .iter()
                .find(|at| at.index == part.index && topic_bytes(&probe_layout.topics[at.topic]) == part.topic)
                .expect("same partitions");
            probe_offsets.push(4 + at.offset);
        }
        let handed = handed(records, parts.len())?;
        let pieces = answer.iter().map(|p| Held::get(&p).map(|h| Piece::Handed(Arc::new(h)))).collect::<PyResult<_>>()?;
        cycle.spent.extend(std::mem::take(&mut cycle.answer));
        cycle.queue.clear();
        cycle.parts = parts;
        cycle.probe = probe;
        cycle.probe_offsets = probe_offsets;
        cycle.answer = pieces;
        cycle.request = request;
        cycle.last = handed;
        cycle.last_answer = false;
        Ok(true)
    }

    /// Hands the answer to the request after the last one handed: each partition's batches (`records`, in the
    /// order of `start`'s partitions; None: none) and aborted transactions (`aborted`: None for read_uncommitted,
    /// else a list per partition). That request is the last one with each partition moved past the batches the last
    /// answer gave it, as a client reading on sends it.
    #[pyo3(signature = (records, aborted=None))]
    fn extend(&mut self, records: &Bound<'_, PyList>, aborted: Option<Vec<Vec<(i64, i64)>>>) -> PyResult<()> {
        let cycle = self.cycle.as_mut().expect("a lane is not run twice at once");
        let records = handed(records, cycle.parts.len())?;
        let aborted = listed(aborted, cycle.parts.len())?;
        let v = cycle.version;
        let layout = walk(&cycle.request, v).expect("walked at start");
        let mut ends: HashMap<(&[u8], i32), (i64, i32)> = HashMap::new();
        for (part, batches) in cycle.parts.iter().zip(&cycle.last) {
            if let Some(end) = batches.as_ref().and_then(|b| last_batch_end(b.bytes())) {
                ends.insert((&part.topic, part.index), end);
            }
        }
        let next = moved(&cycle.request, &layout, &ends);
        let key = request_key(&next, &layout);
        drop(ends);
        cycle.request = next;
        cycle.last = records.clone();
        cycle.queue.push_back(Entry { key, records, aborted });
        Ok(())
    }

    /// How many answers are handed and not served yet (the one due aside).
    fn queued(&self) -> usize {
        self.cycle.as_ref().map_or(0, |c| c.queue.len())
    }

    /// No more answers will be handed: the run serves those queued (none with `drop_queued`), writes the one due and
    /// ends (`done`).
    #[pyo3(signature = (drop_queued=false))]
    fn finish(&mut self, drop_queued: bool) {
        if let Some(cycle) = self.cycle.as_mut() {
            cycle.last_answer = true;
            if drop_queued {
                cycle.queue.clear();
            }
        }
    }

    /// Writes the answer due and goes on (module docs). Returns `lane::RunResult`; `again` with nothing queued
    /// (`queued`): the answer due, if any, was written; hand more (`extend`) or `finish`, then run again.
    fn run<'py>(&mut self, py: Python<'py>) -> PyResult<RunResult<'py>> {
        let mut cycle = self.cycle.take().expect("a lane is not run twice at once");
        let (exit, seen, mut cycle) = py.detach(move || {
            let mut seen = Seen::default();
            let exit = match cycle.cycles(&mut seen) {
                Ok(exit) | Err(exit) => exit,
            };
            (exit, seen, cycle)
        });
        cycle.spent.clear(); // the handed buffers written go back, with the GIL
        cycle.trash.clear();
        if !matches!(exit, Exit::Again) {
            cycle.queue.clear();
            cycle.answer.clear();
            cycle.last.clear();
        }
        let version = cycle.version;
        self.cycle = Some(cycle);
        run_result(py, exit, &seen, version)
    }
}

impl Cycle {
    fn cycles(&mut self, seen: &mut Seen) -> Result<Exit, Exit> {
        let began = Instant::now();
        let v = self.version;
        let mut read_at = Instant::now();
        let correlation = i32_at(&self.probe, 8);
        loop {
            let asked = Instant::now();
            let next = self.queue.pop_front();
            if let Some(entry) = &next {
                self.trash.extend(entry.records.iter().flatten().cloned());
                write_all(self.io.broker, &self.probe, self.io.stop, asked + self.io.idle_timeout)?;
            }
            if !self.answer.is_empty() {
                let pieces: Vec<&[u8]> = self.answer.iter().map(Piece::bytes).collect();
                let size: usize = pieces.iter().map(|p| p.len()).sum();
                write_pieces(self.io.client, &pieces, self.io.stop, Instant::now() + self.io.idle_timeout)
                    .map_err(client_gone)?;
                seen.answers.push((size, Instant::now().duration_since(read_at).as_secs_f64()));
                self.spent.append(&mut self.answer);
            }
            let Some(entry) = next else {
                // nothing due now; with nothing more to come the run ends, else the proxy hands more (or finishes)
                return Ok(if self.last_answer { Exit::Done("the remote answers handed are served") } else { Exit::Again });
            };
            self.io.read_answer(&mut self.probe_answer, correlation)?;
            let Some(request) = self.io.read_request(asked)? else {
                return Ok(Exit::Done("stale"));
            };
            read_at = Instant::now();
            if !matches(&request, v, &entry.key) {
                return Ok(Exit::Request(request, "missed"));
            }
            let frame = &self.probe_answer[4..];
            let Some(offsets) = allowed(frame, v, &self.parts) else {
                return Ok(Exit::Request(request, "refused"));
            };
            if read_at.duration_since(asked) > self.io.max_age {
                return Ok(Exit::Request(request, "stale"));
            }
            if let Ok(scan) = fetch_scan::response_body_start(frame, v).and_then(|b| fetch_scan::scan(frame, v, b)) {
                seen.note(&scan);
            }
            for (at, (high, _)) in self.probe_offsets.iter().zip(&offsets) {
                self.probe[*at..*at + 8].copy_from_slice(&high.to_be_bytes()); // the next probe at the newest
            }
            self.answer = encode(v, i32_at(&request, 4), &self.parts, &offsets, &entry.records, &entry.aborted);
            seen.served += 1;
            if began.elapsed() > self.run_for {
                return Ok(Exit::Again);
            }
        }
    }
}

/// Python's list of batches per partition (`n` of them), each None or a read-only buffer.
fn handed(records: &Bound<'_, PyList>, n: usize) -> PyResult<Vec<Option<Arc<Held>>>> {
    if records.len() != n {
        return Err(PyValueError::new_err(format!("{} partitions' batches given, {n} expected", records.len())));
    }
    records.iter().map(|r| if r.is_none() { Ok(None) } else { Held::get(&r).map(|h| Some(Arc::new(h))) }).collect()
}

fn listed(aborted: Option<Vec<Vec<(i64, i64)>>>, n: usize) -> PyResult<Aborted> {
    match aborted {
        None => Ok(vec![None; n]),
        Some(lists) if lists.len() == n => Ok(lists.into_iter().map(Some).collect()),
        Some(lists) => Err(PyValueError::new_err(format!("{} partitions' aborted transactions, {n} expected", lists.len()))),
    }
}

fn same_partitions(layout: &fetch_scan::Layout<'_>, parts: &[Part]) -> bool {
    layout.partitions.len() == parts.len()
        && parts.iter().all(|part| {
            layout
                .partitions
                .iter()
                .filter(|at| at.index == part.index && topic_bytes(&layout.topics[at.topic]) == part.topic)
                .count()
                == 1
        })
}

/// The probe's answer (after its size prefix) as the remote answer's offsets: each part's (high watermark, last
/// stable offset), in the parts' order; None where the broker did not allow them all (an error, a throttle, node
/// endpoints, a partition missing) or the answer does not scan.
fn allowed(frame: &[u8], version: i16, parts: &[Part]) -> Option<Vec<(i64, i64)>> {
    let body = fetch_scan::response_body_start(frame, version).ok()?;
    let scan: Scan<'_> = fetch_scan::scan(frame, version, body).ok()?;
    if scan.error != 0 || scan.tagged || i32_at(frame, body) != 0 || scan.partitions.len() != parts.len() {
        return None;
    }
    parts
        .iter()
        .map(|part| {
            scan.partitions
                .iter()
                .find(|p| p.index == part.index && topic_bytes(&scan.topics[p.topic]) == part.topic)
                .filter(|p| p.error == 0)
                .map(|p| (p.high_watermark, p.last_stable))
        })
        .collect()
}

/// A Fetch answer (`fetch_answer.fetch_answer_pieces` for what the lane answers: no error, no throttle, no fetch
/// session, no preferred replica, no tagged fields), size prefix first, as pieces: the batches handed are pieces of
/// their own.
fn encode(
    version: i16,
    correlation: i32,
    parts: &[Part],
    offsets: &[(i64, i64)],
    records: &[Option<Arc<Held>>],
    aborted: &Aborted,
) -> Vec<Piece> {
    let flexible = version >= 12;
    let mut pieces = Vec::with_capacity(2 * parts.len() + 1);
    let mut small: Vec<u8> = Vec::with_capacity(64 + 48 * parts.len());
    small.extend_from_slice(&[0, 0, 0, 0]);
    small.extend_from_slice(&correlation.to_be_bytes());
    if flexible {
        small.push(0);
    }
    small.extend_from_slice(&0i32.to_be_bytes()); // throttle_time_ms
    if version >= 7 {
        small.extend_from_slice(&0i16.to_be_bytes()); // error_code
        small.extend_from_slice(&0i32.to_be_bytes()); // session_id
    }
    let mut topics: Vec<(usize, usize)> = Vec::new(); // (first part, count) per topic, in order
    for (i, part) in parts.iter().enumerate() {
        match topics.last_mut() {
            Some((first, n)) if parts[*first].topic == part.topic => *n += 1,
            _ => topics.push((i, 1)),
        }
    }
    length(&mut small, Some(topics.len()), flexible);
    for (first, n) in topics {
        let topic = &parts[first].topic;
        if version >= 13 {
            small.extend_from_slice(topic);
        } else if flexible {
            uvarint(&mut small, topic.len() as u64 + 1);
            small.extend_from_slice(topic);
        } else {
            small.extend_from_slice(&(topic.len() as i16).to_be_bytes());
            small.extend_from_slice(topic);
        }
        length(&mut small, Some(n), flexible);
        for i in first..first + n {
            let (part, (high, stable)) = (&parts[i], offsets[i]);
            small.extend_from_slice(&part.index.to_be_bytes());
            small.extend_from_slice(&0i16.to_be_bytes());
            small.extend_from_slice(&high.to_be_bytes());
            small.extend_from_slice(&stable.to_be_bytes());
            if version >= 5 {
                small.extend_from_slice(&part.log_start.to_be_bytes());
            }
            let listed = aborted[i].as_ref();
            length(&mut small, listed.map(|l| l.len()), flexible); // null for read_uncommitted
            for (producer_id, first_offset) in listed.into_iter().flatten() {
                small.extend_from_slice(&producer_id.to_be_bytes());
                small.extend_from_slice(&first_offset.to_be_bytes());
                if flexible {
                    small.push(0);
                }
            }
            if version >= 11 {
                small.extend_from_slice(&(-1i32).to_be_bytes()); // preferred_read_replica
            }
            let batches = records[i].as_ref().filter(|b| !b.bytes().is_empty());
            length(&mut small, Some(batches.map_or(0, |b| b.bytes().len())), flexible);
            if let Some(b) = batches {
                pieces.push(Piece::Own(std::mem::take(&mut small)));
                pieces.push(Piece::Handed(b.clone()));
            }
            if flexible {
                small.push(0); // the partition's tagged fields
            }
        }
        if flexible {
            small.push(0); // the topic's tagged fields
        }
    }
    if flexible {
        small.push(0); // the answer's tagged fields
    }
    pieces.push(Piece::Own(small));
    let size: usize = pieces.iter().map(|p| p.bytes().len()).sum::<usize>() - 4;
    if let Piece::Own(first) = &mut pieces[0] {
        first[..4].copy_from_slice(&(size as i32).to_be_bytes());
    }
    pieces
}

/// An array's count or a byte string's length (None: null), compact (+1, unsigned varint) or int32.
fn length(buf: &mut Vec<u8>, n: Option<usize>, flexible: bool) {
    if flexible {
        uvarint(buf, n.map_or(0, |n| n as u64 + 1));
    } else {
        buf.extend_from_slice(&n.map_or(-1, |n| n as i32).to_be_bytes());
    }
}

fn uvarint(buf: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        buf.push((value as u8) | 0x80);
        value >>= 7;
    }
    buf.push(value as u8);
}

/// The answer `encode` writes, whole, for the tests (`fetch_answer.fetch_answer_pieces` is the reference): the
/// parts as `start` takes them, each partition's (high watermark, last stable offset), batches and aborted
/// transactions (as `extend` takes them).
#[pyfunction]
#[pyo3(signature = (version, correlation_id, partitions, offsets, records, aborted=None))]
pub fn remote_answer<'py>(
    py: Python<'py>,
    version: i16,
    correlation_id: i32,
    partitions: Vec<(Vec<u8>, i32, i64)>,
    offsets: Vec<(i64, i64)>,
    records: &Bound<'py, PyList>,
    aborted: Option<Vec<Vec<(i64, i64)>>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let parts: Vec<Part> =
        partitions.into_iter().map(|(topic, index, log_start)| Part { topic, index, log_start }).collect();
    if offsets.len() != parts.len() {
        return Err(PyValueError::new_err("one (high watermark, last stable offset) per partition"));
    }
    let records = handed(records, parts.len())?;
    let aborted = listed(aborted, parts.len())?;
    let pieces = encode(version, correlation_id, &parts, &offsets, &records, &aborted);
    let whole: Vec<u8> = pieces.iter().flat_map(|p| p.bytes().iter().copied()).collect();
    Ok(PyBytes::new(py, &whole))
}
