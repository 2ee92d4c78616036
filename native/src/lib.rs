//! tiering_native: Kafka record batches v2 decoded in compiled code.
//!
//! The pure-Python decoder (`tiering_core.formats`) is the reference; this module accepts and rejects
//! exactly the same inputs (the differential tests in tests/unit/test_native_decoder.py hold it to
//! that). Three entry points, two walks for the proxy, and its two Fetch cycles:
//!
//! - `batch_payload`: a batch's records section, CRC-32C checked and decompressed (GIL released);
//! - `decode_records`: records of a records section as tuples of a given tuple type (the messages the
//!   TieredConsumer returns), built straight from the bytes;
//! - `ColumnDecoder`: whole batches into plain column buffers for Arrow (the Spark data source),
//!   GIL released for the whole walk;
//! - `fetch_answer_scan`: a broker's Fetch answer's partition headers (`fetch_scan`), its records skipped;
//! - `fetch_request_layout`: where a client's Fetch request's fields are;
//! - `FetchLane`: a connection's pass-through Fetch cycle, run with the GIL released (`fetch_lane`);
//! - `RemoteLane`: a connection's Fetch cycle from remote storage, the same way (`remote_lane`).
//!
//! Corrupt input raises `DecodeError(kind, position, reason)` (kind: "format", "unsupported" or
//! "truncated", as FormatError, UnsupportedFormatError and TruncatedBatchError; position: the batch's
//! byte position in the buffer given), or ValueError for malformed records in `decode_records`.

use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple, PyType};

mod batch;
mod columns;
mod fetch_lane;
mod fetch_scan;
mod lane;
mod lane_io;
mod lz4;
mod protobuf;
mod record;
mod window;
mod remote_lane;

use batch::{Kind, LOG_OVERHEAD};

create_exception!(tiering_native, DecodeError, PyValueError, "Corrupt input: args are (kind, position, reason).");

/// A decoding failure outside the GIL, turned into DecodeError with it.
pub struct Failure {
    pub kind: Kind,
    pub position: usize,
    pub reason: String,
}

pub fn decode_error(f: Failure) -> PyErr {
    let kind = match f.kind {
        Kind::Format => "format",
        Kind::Unsupported => "unsupported",
        Kind::Truncated => "truncated",
    };
    DecodeError::new_err((kind, f.position, f.reason))
}

/// Run `f` on the bytes of `obj` (bytes, or any C-contiguous byte buffer: memoryview, mmap, bytearray).
pub fn with_buffer<R>(obj: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> R) -> PyResult<R> {
    if let Ok(bytes) = obj.cast::<PyBytes>() {
        return Ok(f(bytes.as_bytes()));
    }
    let buffer = PyBuffer::<u8>::get(obj)?;
    if !buffer.is_c_contiguous() {
        return Err(PyTypeError::new_err("a C-contiguous byte buffer is required"));
    }
    // The exporter keeps the memory alive and unmoved while `buffer` is held (until the end of this call).
    let data = unsafe { std::slice::from_raw_parts(buffer.buf_ptr() as *const u8, buffer.len_bytes()) };
    Ok(f(data))
}

/// The records section of the batch at ``position`` of ``buf`` (``length``: its length field), its
/// CRC-32C checked against ``crc`` when ``verify_crc``, decompressed for ``codec`` 1-4. The GIL is
/// released throughout. Uncompressed and LZ4 sections (the common frame layout, see `lz4`) are written
/// straight into the bytes object returned; the other codecs decompress into a buffer first.
#[pyfunction]
#[pyo3(signature = (buf, position, length, crc, codec, verify_crc=true))]
fn batch_payload<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
    position: usize,
    length: usize,
    crc: u32,
    codec: u8,
    verify_crc: bool,
) -> PyResult<Bound<'py, PyBytes>> {
    let fail = |reason: String| Failure { kind: Kind::Format, position, reason };
    with_buffer(buf, |data| -> PyResult<Bound<'py, PyBytes>> {
        if length < batch::HEADER_SIZE - LOG_OVERHEAD || position + LOG_OVERHEAD + length > data.len() {
            let reason = format!("batch of {} bytes extends past the buffer", length + LOG_OVERHEAD);
            return Err(decode_error(fail(reason)));
        }
        let check = || if verify_crc { batch::check_crc(data, position, length, crc).map_err(fail) } else { Ok(()) };
        let section = &data[position + batch::HEADER_SIZE..position + LOG_OVERHEAD + length];
        if codec == 0 {
            return filled_bytes(py, section.len(), |out| {
                check()?;
                out.copy_from_slice(section);
                Ok(section.len())
            });
        }
        if codec == 3 {
            // the frame's block table is read with the GIL held (a few reads per 64 KiB), the blocks without it
            let lz4_fail = |reason: String| fail(format!("lz4 decompression failed: {reason}"));
            return match lz4::Frame::parse(section) {
                Ok(frame) => filled_bytes(py, frame.bound, |out| {
                    check()?;
                    frame.decode_into(out).map_err(lz4_fail)
                }),
                Err(reason) => {
                    py.detach(check).map_err(decode_error)?; // a CRC mismatch is the error to give first
                    Err(decode_error(lz4_fail(reason)))
                }
            };
        }
        let result = py.detach(|| -> Result<Vec<u8>, Failure> {
            check()?;
            batch::decompress(codec, section).map_err(fail)
        });
        Ok(PyBytes::new(py, &result.map_err(decode_error)?))
    })?
}

/// A new bytes object of at most ``size`` bytes written by ``fill`` with the GIL released (nothing else
/// can see the object yet), cut to the length ``fill`` returns.
fn filled_bytes<'py>(
    py: Python<'py>,
    size: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<usize, Failure> + Send,
) -> PyResult<Bound<'py, PyBytes>> {
    unsafe {
        let mut obj = ffi::PyBytes_FromStringAndSize(std::ptr::null(), size as ffi::Py_ssize_t);
        if obj.is_null() {
            return Err(PyErr::fetch(py));
        }
        let bytes = Bound::from_owned_ptr(py, obj); // dropped (freed) on an early return
        let out = std::slice::from_raw_parts_mut(ffi::PyBytes_AsString(obj) as *mut u8, size);
        let written = py.detach(|| fill(out)).map_err(decode_error)?;
        if written == size {
            return Ok(bytes.cast_into_unchecked());
        }
        let _ = bytes.into_ptr(); // _PyBytes_Resize takes over the reference (and frees the object on failure)
        if ffi::_PyBytes_Resize(&mut obj, written as ffi::Py_ssize_t) != 0 {
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, obj).cast_into_unchecked())
    }
}

/// A Python int from an i128 (the small-int path when it fits an i64).
#[inline(always)]
pub(crate) fn int(py: Python<'_>, value: i128) -> PyResult<*mut ffi::PyObject> {
    Ok(match i64::try_from(value) {
        Ok(v) => v.into_pyobject(py)?.into_ptr(),
        Err(_) => value.into_pyobject(py)?.into_ptr(),
    })
}

/// An instance of the tuple type ``tp`` (``tuple_type``) holding ``fields``, whose references it takes.
pub(crate) fn tuple_of<'py, const N: usize>(
    py: Python<'py>,
    tp: *mut ffi::PyTypeObject,
    exact: bool,
    fields: [*mut ffi::PyObject; N],
) -> PyResult<Bound<'py, PyAny>> {
    unsafe {
        let n = N as ffi::Py_ssize_t;
        let obj = if exact { ffi::PyTuple_New(n) } else { ((*tp).tp_alloc.unwrap())(tp, n) };
        if obj.is_null() {
            for item in fields {
                ffi::Py_DECREF(item);
            }
            return Err(PyErr::fetch(py));
        }
        for (i, item) in fields.into_iter().enumerate() {
            ffi::PyTuple_SET_ITEM(obj, i as ffi::Py_ssize_t, item);
        }
        Ok(Bound::from_owned_ptr(py, obj))
    }
}

/// Checks that ``cls`` is tuple or a tuple subclass laid out as a tuple (no instance dict or extra
/// slots: ``__slots__ = ()``), so its instances can be allocated as tuple.__new__ allocates them.
pub(crate) fn tuple_type(cls: &Bound<'_, PyType>) -> PyResult<(*mut ffi::PyTypeObject, bool)> {
    let tp = cls.as_type_ptr();
    unsafe {
        let tuple = &raw mut ffi::PyTuple_Type;
        if tp == tuple {
            return Ok((tp, true));
        }
        if ffi::PyType_IsSubtype(tp, tuple) == 0
            || (*tp).tp_basicsize != (*tuple).tp_basicsize
            || (*tp).tp_itemsize != (*tuple).tp_itemsize
            || (*tp).tp_dictoffset != 0
            || (*tp).tp_alloc.is_none()
        {
            return Err(PyTypeError::new_err("cls must be tuple or a tuple subclass with __slots__ = ()"));
        }
    }
    Ok((tp, false))
}

/// Decode ``count`` records from byte ``pos`` of ``data`` (an uncompressed records section) as
/// ``cls((offset, timestamp, key, value, headers))``: (the records, the position after them).
/// ``log_append_time``: the batch's max timestamp under LogAppendTime (every record's timestamp),
/// else None. ValueError on malformed records.
#[pyfunction]
#[pyo3(signature = (data, pos, count, base_offset, base_timestamp, log_append_time, cls))]
#[allow(clippy::too_many_arguments)]
fn decode_records<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    pos: usize,
    count: i64,
    base_offset: i64,
    base_timestamp: i64,
    log_append_time: Option<i64>,
    cls: &Bound<'py, PyType>,
) -> PyResult<(Bound<'py, PyList>, usize)> {
    let (tp, exact) = tuple_type(cls)?;
    with_buffer(data, |data| -> PyResult<(Bound<'py, PyList>, usize)> {
        let mut pos = pos;
        if pos > data.len() {
            return Err(PyValueError::new_err("position past the records"));
        }
        let room = (data.len() - pos) / 7 + 1; // a record takes at least 7 bytes
        let mut out: Vec<Bound<'py, PyAny>> = Vec::with_capacity((count.max(0) as usize).min(room));
        let mut headers = Vec::new();
        let none = py.None();
        for _ in 0..count {
            let f = record::parse(data, &mut pos, &mut headers).map_err(|m| PyValueError::new_err(m.0))?;
            let ts = match log_append_time {
                Some(t) => t as i128,
                None => base_timestamp as i128 + f.ts_delta,
            };
            let blob = |span: Option<record::Span>| match span {
                Some(s) => PyBytes::new(py, &data[s]).into_any().into_ptr(),
                None => none.clone_ref(py).into_ptr(),
            };
            let header_tuple = if headers.is_empty() {
                PyTuple::empty(py)
            } else {
                let items = headers.iter().map(|(k, v)| {
                    // checked UTF-8 by record::parse
                    let key = PyString::new(py, unsafe { std::str::from_utf8_unchecked(&data[k.clone()]) });
                    let value = match v {
                        Some(s) => PyBytes::new(py, &data[s.clone()]).into_any(),
                        None => none.bind(py).clone(),
                    };
                    PyTuple::new(py, [key.into_any(), value]).unwrap()
                });
                PyTuple::new(py, items)?
            };
            let fields = [
                int(py, base_offset as i128 + f.off_delta)?,
                int(py, ts)?,
                blob(f.key),
                blob(f.value),
                header_tuple.into_ptr(),
            ];
            out.push(tuple_of(py, tp, exact, fields)?);
        }
        Ok((PyList::new(py, out)?, pos))
    })?
}

/// A broker's Fetch answer of ``version`` from byte ``start`` (its body), walked by its lengths
/// (`fetch_scan`): (top-level error, whether top-level tagged fields are present, the topics as named (16
/// bytes of id, or the name), one tuple per partition (topic's index in those, partition index, error, high
/// watermark, last stable offset, log start, records' size, where they begin)). ValueError naming what breaks.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn fetch_answer_scan<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
    version: i16,
    start: usize,
) -> PyResult<(i16, bool, Bound<'py, PyList>, Bound<'py, PyList>)> {
    with_buffer(buf, |data| {
        let scanned = fetch_scan::scan(data, version, start).map_err(PyValueError::new_err)?;
        let topics = topic_list(py, &scanned.topics)?;
        let partitions = PyList::empty(py);
        for p in &scanned.partitions {
            partitions.append((
                p.topic,
                p.index,
                p.error,
                p.high_watermark,
                p.last_stable,
                p.log_start,
                p.records,
                p.records_at,
            ))?;
        }
        Ok((scanned.error, scanned.tagged, topics, partitions))
    })?
}

/// A client's Fetch request of ``version``, its body at ``start``, walked for where its fields are
/// (`fetch_scan::layout`): (max_wait's position, the session's (-1 before v7), the topics as named (16 bytes of
/// id, or the name), one tuple per partition (topic's index in those, partition index, and the positions of
/// fetch_offset, last_fetched_epoch (-1 before v12), partition_max_bytes, the partition's start and end), the
/// forgotten topics' count, where the topics begin and end). ValueError naming what breaks.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn fetch_request_layout<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
    version: i16,
    start: usize,
) -> PyResult<(usize, i64, Bound<'py, PyList>, Bound<'py, PyList>, usize, usize, usize)> {
    with_buffer(buf, |data| {
        let layout = fetch_scan::layout(data, version, start).map_err(PyValueError::new_err)?;
        let topics = topic_list(py, &layout.topics)?;
        let partitions = PyList::empty(py);
        for p in &layout.partitions {
            let epoch = p.epoch.map_or(-1, |e| e as i64);
            partitions.append((p.topic, p.index, p.offset, epoch, p.max_bytes, p.start, p.end))?;
        }
        let session = layout.session.map_or(-1, |s| s as i64);
        Ok((layout.max_wait, session, topics, partitions, layout.forgotten, layout.topics_at, layout.topics_end))
    })?
}

/// The topics of a Fetch answer or request as Python objects: bytes of an id, or str of a name.
fn topic_list<'py>(py: Python<'py>, named: &[fetch_scan::Topic<'_>]) -> PyResult<Bound<'py, PyList>> {
    let topics = PyList::empty(py);
    for topic in named {
        match topic {
            fetch_scan::Topic::Id(id) => topics.append(PyBytes::new(py, id))?,
            fetch_scan::Topic::Name(name) => topics.append(PyString::new(py, name))?,
        }
    }
    Ok(topics)
}

#[pymodule]
fn tiering_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("DecodeError", m.py().get_type::<DecodeError>())?;
    m.add_function(wrap_pyfunction!(batch_payload, m)?)?;
    m.add_function(wrap_pyfunction!(decode_records, m)?)?;
    m.add_function(wrap_pyfunction!(fetch_answer_scan, m)?)?;
    m.add_function(wrap_pyfunction!(fetch_request_layout, m)?)?;
    m.add_function(wrap_pyfunction!(window::checked_window, m)?)?;
    m.add_class::<columns::ColumnDecoder>()?;
    m.add_class::<fetch_lane::FetchLane>()?;
    m.add_class::<remote_lane::RemoteLane>()?;
    m.add_function(wrap_pyfunction!(remote_lane::remote_answer, m)?)?;
    m.add_function(wrap_pyfunction!(protobuf::protobuf_compile, m)?)?;
    m.add_function(wrap_pyfunction!(protobuf::protobuf_json_schema, m)?)?;
    m.add_class::<protobuf::ProtobufDecoder>()?;
    Ok(())
}
