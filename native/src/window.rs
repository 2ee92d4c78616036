//! A downloaded window's batches checked in one call: what `reader.batches.checked_window` does in Python, in the
//! same order and with the same faults (the window must be whole batches by their length fields; every header
//! valid as `batch::check_header` has it; offsets growing from above `after` and inside the copy's
//! `[first, last]`; every batch's CRC-32C), with the GIL released for the walk. A remote reader runs it on the
//! download thread for each window before a byte of it is served; the headers it returns are the
//! `BatchHeader`s the Python scan would make.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyType};

use crate::batch::{self, Header, Kind, LOG_OVERHEAD, MIN_LENGTH};
use crate::{decode_error, int, tuple_of, tuple_type, with_buffer, Failure};

fn fault(position: usize, reason: String) -> Failure {
    Failure { kind: Kind::Format, position, reason }
}

/// The window's batches (position, header), checked; the first fault found, in the Python passes' order.
fn walk(buf: &[u8], first: i64, last: i64, after: i64) -> Result<Vec<(usize, Header)>, Failure> {
    let end = buf.len();
    let mut pos = 0;
    while end - pos >= LOG_OVERHEAD {
        let length = i32::from_be_bytes(buf[pos + 8..pos + 12].try_into().unwrap());
        if length < MIN_LENGTH {
            return Err(fault(pos, format!("batch length {length} is below the minimum {MIN_LENGTH}")));
        }
        if pos + LOG_OVERHEAD + length as usize > end {
            break;
        }
        pos += LOG_OVERHEAD + length as usize;
    }
    if pos != end {
        return Err(fault(pos, "a window of the object ends inside a batch".into()));
    }
    let mut batches = Vec::new();
    let mut pos = 0;
    while pos < end {
        // As `tiering_core.formats.batch.scan_headers`: a v2 header of a sane length and codec is taken as it is
        // (its counts are covered by the CRC, checked below); anything else gets `check_header`'s precise fault.
        let length = i32::from_be_bytes(buf[pos + 8..pos + 12].try_into().unwrap());
        let codec = buf[pos + 22] & 7;
        if buf[pos + 16] == 2 && length >= MIN_LENGTH && pos + LOG_OVERHEAD + length as usize <= end && codec <= 4 {
            let h = batch::unpack(buf, pos);
            batches.push((pos, h));
            pos += h.size();
            continue;
        }
        match batch::check_header(buf, pos, end) {
            Ok(Some(h)) => {
                batches.push((pos, h));
                pos += h.size();
            }
            Ok(None) => break, // unreachable after the length walk above (every length is at least the minimum)
            Err(bad) => return Err(Failure { kind: bad.kind, position: pos, reason: bad.reason }),
        }
    }
    let mut seen = after as i128;
    for (pos, h) in &batches {
        let (low, high) = (h.base_offset as i128, h.last_offset());
        if low <= seen || high > last as i128 || low < first as i128 {
            return Err(fault(
                *pos,
                format!("batch offsets {low}..{high} out of order or outside the copy's {first}..{last}"),
            ));
        }
        seen = high;
    }
    for (pos, h) in &batches {
        batch::check_crc(buf, *pos, h.length as usize, h.crc).map_err(|reason| fault(*pos, reason))?;
    }
    Ok(batches)
}

/// ``data``'s batches as instances of ``cls`` (``BatchHeader``: the 13 header fields, then the position),
/// checked as the module says; DecodeError(kind, position in ``data``, reason) for the first fault.
#[pyfunction]
#[pyo3(signature = (data, first, last, after, cls))]
pub fn checked_window<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    first: i64,
    last: i64,
    after: i64,
    cls: &Bound<'py, PyType>,
) -> PyResult<Bound<'py, PyList>> {
    let (tp, exact) = tuple_type(cls)?;
    with_buffer(data, |buf| -> PyResult<Bound<'py, PyList>> {
        let batches = py.detach(|| walk(buf, first, last, after)).map_err(decode_error)?;
        let mut out = Vec::with_capacity(batches.len());
        for (pos, h) in batches {
            let i32_at = |at: usize| i32::from_be_bytes(buf[pos + at..pos + at + 4].try_into().unwrap()) as i128;
            let epoch = i16::from_be_bytes(buf[pos + 51..pos + 53].try_into().unwrap()) as i128;
            out.push(tuple_of(py, tp, exact, [
                int(py, h.base_offset as i128)?,
                int(py, h.length as i128)?,
                int(py, i32_at(12))?,
                int(py, buf[pos + 16] as i128)?,
                int(py, h.crc as i128)?,
                int(py, h.attributes as i128)?,
                int(py, h.last_offset_delta as i128)?,
                int(py, h.base_timestamp as i128)?,
                int(py, h.max_timestamp as i128)?,
                int(py, h.producer_id as i128)?,
                int(py, epoch)?,
                int(py, i32_at(53))?,
                int(py, h.records_count as i128)?,
                int(py, pos as i128)?,
            ])?);
        }
        PyList::new(py, out)
    })?
}
