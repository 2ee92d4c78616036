//! Whole batches decoded into plain column buffers for Arrow (Spark's Kafka source schema), with the
//! GIL released: the Python side wraps the buffers with `pyarrow.Array.from_buffers`.
//!
//! The walk mirrors `reader.spark.slices.read_slice`: every batch's header checked, its CRC-32C, its
//! offsets inside the copy and after the batch before it; control batches and the batches of aborted
//! transactions dropped, rows outside the slice's offsets left out.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::batch::{self, Header, Kind, HEADER_SIZE, LOG_OVERHEAD, MIN_LENGTH};
use crate::record::{self, HeaderSpan};
use crate::{decode_error, with_buffer, Failure};

/// The largest timestamp (ms) Spark's microsecond timestamps hold; a record beyond it is malformed.
const MAX_TIMESTAMP_MS: i128 = (i64::MAX / 1000) as i128;

/// A variable-size binary column: Arrow's offsets, data and validity bitmap.
struct Binary {
    offsets: Vec<i32>,
    data: Vec<u8>,
    validity: Vec<u8>,
    len: usize,
    nulls: usize,
}

impl Binary {
    fn new() -> Self {
        Binary { offsets: vec![0], data: Vec::new(), validity: Vec::new(), len: 0, nulls: 0 }
    }

    #[inline]
    fn push(&mut self, field: Option<&[u8]>) -> Result<(), String> {
        if self.len.is_multiple_of(8) {
            self.validity.push(0);
        }
        match field {
            Some(bytes) => {
                self.data.extend_from_slice(bytes);
                *self.validity.last_mut().unwrap() |= 1 << (self.len % 8);
            }
            None => self.nulls += 1,
        }
        self.len += 1;
        let end = i32::try_from(self.data.len()).map_err(|_| "column data over 2 GiB".to_string())?;
        self.offsets.push(end);
        Ok(())
    }

    /// (offsets, data, validity or None when nothing is null) as Python bytes.
    fn emit<'py>(&self, py: Python<'py>) -> (Bound<'py, PyBytes>, Bound<'py, PyBytes>, Option<Bound<'py, PyBytes>>) {
        let validity = (self.nulls > 0).then(|| PyBytes::new(py, &self.validity));
        (PyBytes::new(py, as_bytes(&self.offsets)), PyBytes::new(py, &self.data), validity)
    }
}

fn as_bytes<T: Copy>(values: &[T]) -> &[u8] {
    // plain integers, native (little-endian) order as Arrow wants them
    unsafe { std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values)) }
}

struct Columns {
    offsets: Vec<i64>,
    timestamps: Vec<i64>,
    timestamp_types: Vec<i32>,
    keys: Binary,
    values: Binary,
    header_offsets: Vec<i32>,
    header_keys: Binary,
    header_values: Binary,
}

impl Columns {
    fn new() -> Self {
        Columns {
            offsets: Vec::new(),
            timestamps: Vec::new(),
            timestamp_types: Vec::new(),
            keys: Binary::new(),
            values: Binary::new(),
            header_offsets: vec![0],
            header_keys: Binary::new(),
            header_values: Binary::new(),
        }
    }

    fn data_bytes(&self) -> usize {
        self.keys.data.len() + self.values.data.len() + self.header_keys.data.len() + self.header_values.data.len()
    }
}

/// Decodes the batches of one slice into columns, window by window (``decode``), until ``flush``.
#[pyclass(module = "tiering_native")]
pub struct ColumnDecoder {
    first_offset: i64,
    last_offset: i64,
    aborted: Vec<(i64, i64, i64)>,
    low: i64,
    high: i64,
    previous: i128,
    columns: Columns,
}

#[pymethods]
impl ColumnDecoder {
    /// Rows with offsets in ``[first_offset, last_offset]``; ``aborted``: (producer id, first offset,
    /// last offset) of the aborted transactions; batches must lie in the copy's ``[low, high]``.
    #[new]
    fn new(first_offset: i64, last_offset: i64, aborted: Vec<(i64, i64, i64)>, low: i64, high: i64) -> Self {
        ColumnDecoder {
            first_offset,
            last_offset,
            aborted,
            low,
            high,
            previous: low as i128 - 1,
            columns: Columns::new(),
        }
    }

    /// Decode the whole batches of ``buf`` from byte ``start`` on, until one does not fit in ``buf``
    /// (the first one is always decoded or raises) or ``max_rows`` rows or ``max_bytes`` bytes of
    /// fields are held. Returns the position after the last batch decoded. Raises DecodeError with
    /// the position in ``buf`` of the batch at fault.
    fn decode(&mut self, py: Python<'_>, buf: &Bound<'_, PyAny>, start: usize, max_rows: usize, max_bytes: usize) -> PyResult<usize> {
        let result = with_buffer(buf, |data| py.detach(|| self.walk(data, start, max_rows, max_bytes)))?;
        result.map_err(decode_error)
    }

    #[getter]
    fn rows(&self) -> usize {
        self.columns.offsets.len()
    }

    #[getter]
    fn data_bytes(&self) -> usize {
        self.columns.data_bytes()
    }

    /// The rows held as buffers, and a fresh start: (rows, offsets, timestamps (ms), timestamp types,
    /// key offsets, key data, key validity, the same three for values, header list offsets, then
    /// header key offsets and data, header value offsets, data and validity). Integers are int64 or
    /// int32 in native order; a validity bitmap is None when nothing is null.
    fn flush<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let c = std::mem::replace(&mut self.columns, Columns::new());
        let (ko, kd, kv) = c.keys.emit(py);
        let (vo, vd, vv) = c.values.emit(py);
        let (hko, hkd, _) = c.header_keys.emit(py);
        let (hvo, hvd, hvv) = c.header_values.emit(py);
        let items: Vec<Bound<'py, PyAny>> = vec![
            c.offsets.len().into_pyobject(py)?.into_any(),
            PyBytes::new(py, as_bytes(&c.offsets)).into_any(),
            PyBytes::new(py, as_bytes(&c.timestamps)).into_any(),
            PyBytes::new(py, as_bytes(&c.timestamp_types)).into_any(),
            ko.into_any(),
            kd.into_any(),
            kv.into_pyobject(py)?.into_any(),
            vo.into_any(),
            vd.into_any(),
            vv.into_pyobject(py)?.into_any(),
            PyBytes::new(py, as_bytes(&c.header_offsets)).into_any(),
            hko.into_any(),
            hkd.into_any(),
            hvo.into_any(),
            hvd.into_any(),
            hvv.into_pyobject(py)?.into_any(),
        ];
        PyTuple::new(py, items)
    }
}

impl ColumnDecoder {
    fn walk(&mut self, data: &[u8], start: usize, max_rows: usize, max_bytes: usize) -> Result<usize, Failure> {
        let end = data.len();
        let mut pos = start;
        let mut first = true;
        let mut headers: Vec<HeaderSpan> = Vec::new();
        while pos < end {
            if !first {
                // a batch that does not fit is left for the caller to fetch whole
                if end - pos < HEADER_SIZE {
                    break;
                }
                let length = i32::from_be_bytes(data[pos + 8..pos + 12].try_into().unwrap());
                if length >= MIN_LENGTH && pos + LOG_OVERHEAD + length as usize > end {
                    break;
                }
            }
            first = false;
            let header = match batch::check_header(data, pos, end) {
                Ok(Some(h)) => h,
                Ok(None) => return Err(Failure::format(pos, "no record batch where one was expected".into())),
                Err(bad) => return Err(Failure { kind: bad.kind, position: pos, reason: bad.reason }),
            };
            batch::check_crc(data, pos, header.length as usize, header.crc).map_err(|r| Failure::format(pos, r))?;
            let last = header.last_offset();
            if (header.base_offset as i128) <= self.previous || last > self.high as i128 {
                return Err(Failure::format(
                    pos,
                    format!(
                        "batch offsets {}-{last} are not after {} and within the copy's {}-{}",
                        header.base_offset, self.previous, self.low, self.high
                    ),
                ));
            }
            self.previous = last;
            if self.wanted(&header) {
                self.add_batch(data, pos, &header, &mut headers)?;
            }
            pos += header.size();
            if self.columns.offsets.len() >= max_rows || self.columns.data_bytes() >= max_bytes {
                break;
            }
        }
        Ok(pos)
    }

    fn wanted(&self, h: &Header) -> bool {
        h.last_offset() >= self.first_offset as i128
            && h.base_offset <= self.last_offset
            && !h.is_control()
            && !(h.is_transactional()
                && self.aborted.iter().any(|&(pid, first, last)| {
                    pid == h.producer_id && first <= h.base_offset && h.base_offset <= last
                }))
    }

    fn add_batch(&mut self, data: &[u8], pos: usize, h: &Header, headers: &mut Vec<HeaderSpan>) -> Result<(), Failure> {
        let section = &data[pos + HEADER_SIZE..pos + h.size()];
        let owned;
        let payload = if h.codec() == 0 {
            section
        } else {
            owned = batch::decompress(h.codec(), section).map_err(|r| Failure::format(pos, r))?;
            &owned[..]
        };
        self.add_records(payload, h, headers)
            .map_err(|r| Failure::format(pos, format!("malformed records: {r}")))
    }

    fn add_records(&mut self, payload: &[u8], h: &Header, headers: &mut Vec<HeaderSpan>) -> Result<(), String> {
        let c = &mut self.columns;
        let append_time = h.log_append_time();
        let mut p = 0usize;
        for _ in 0..h.records_count {
            let f = record::parse(payload, &mut p, headers).map_err(|m| m.0)?;
            let offset = h.base_offset as i128 + f.off_delta;
            let offset = i64::try_from(offset).map_err(|_| format!("offset {offset} out of range"))?;
            let ts = if append_time { h.max_timestamp as i128 } else { h.base_timestamp as i128 + f.ts_delta };
            if ts.abs() > MAX_TIMESTAMP_MS {
                return Err(format!("timestamp {ts} out of range"));
            }
            let ts = ts as i64;
            if offset < self.first_offset || offset > self.last_offset {
                continue;
            }
            c.offsets.push(offset);
            c.timestamps.push(ts);
            c.timestamp_types.push(append_time as i32);
            c.keys.push(f.key.map(|s| &payload[s]))?;
            c.values.push(f.value.map(|s| &payload[s]))?;
            for (k, v) in headers.iter() {
                c.header_keys.push(Some(&payload[k.clone()]))?;
                c.header_values.push(v.clone().map(|s| &payload[s]))?;
            }
            let count = i32::try_from(c.header_keys.len).map_err(|_| "too many headers".to_string())?;
            c.header_offsets.push(count);
        }
        if p != payload.len() {
            return Err(format!("{} bytes remain after {} records", payload.len() - p, h.records_count));
        }
        Ok(())
    }
}

impl Failure {
    pub fn format(position: usize, reason: String) -> Self {
        Failure { kind: Kind::Format, position, reason }
    }
}
