//! Record v2 parsing: zigzag varints and one record's field spans.
//!
//! The rules are those of the pure-Python reference (`tiering_core/formats/records.py`), so both
//! accept and reject the same inputs: varints are read as varlongs of up to 10 bytes (held in an
//! i128, as Python's unbounded ints hold them), a key or value length below -1 and a negative header
//! count or header key length are errors, a negative header value length is a null value, header keys
//! must be UTF-8, and a record's fields must end exactly where its length says.

use std::ops::Range;

/// A malformed record: the reason, as the Python decoder words it where it has words.
#[derive(Debug)]
pub struct Malformed(pub String);

pub type Span = Range<usize>;

/// One record's fields: deltas and the spans of key and value in the records section (None: null).
pub struct Fields {
    pub ts_delta: i128,
    pub off_delta: i128,
    pub key: Option<Span>,
    pub value: Option<Span>,
}

/// One header: the key's span (checked UTF-8) and the value's (None: null).
pub type HeaderSpan = (Span, Option<Span>);

#[inline(always)]
fn byte(data: &[u8], pos: usize) -> Result<u8, Malformed> {
    data.get(pos).copied().ok_or_else(|| Malformed("index out of range".into()))
}

/// Zigzag varlong at `*pos` (up to 10 bytes), advancing `*pos`.
#[inline(always)]
pub fn varint(data: &[u8], pos: &mut usize) -> Result<i128, Malformed> {
    let b = byte(data, *pos)?;
    if b < 0x80 {
        *pos += 1;
        let u = b as i128;
        return Ok((u >> 1) ^ -(u & 1));
    }
    varint_slow(data, pos)
}

#[cold]
fn varint_slow(data: &[u8], pos: &mut usize) -> Result<i128, Malformed> {
    let mut result: u128 = 0;
    let mut shift = 0u32;
    loop {
        let b = byte(data, *pos)?;
        *pos += 1;
        result |= ((b & 0x7f) as u128) << shift;
        if b < 0x80 {
            let u = result as i128;
            return Ok((u >> 1) ^ -(u & 1));
        }
        shift += 7;
        if shift > 63 {
            return Err(Malformed("varint longer than 10 bytes".into()));
        }
    }
}

/// Parse the record at `*pos` of `data` (a records section), advancing `*pos` past it. Headers are
/// appended to `headers` (cleared first).
#[inline]
pub fn parse(data: &[u8], pos: &mut usize, headers: &mut Vec<HeaderSpan>) -> Result<Fields, Malformed> {
    let end = data.len() as i128;
    let length = varint(data, pos)?;
    let record_end = *pos as i128 + length;
    if length < 6 || record_end > end {
        return Err(Malformed(format!("record length {length} out of bounds")));
    }
    let record_end = record_end as usize;
    *pos += 1; // attributes (unused)
    let ts_delta = varint(data, pos)?;
    let off_delta = varint(data, pos)?;
    let key = blob(data, pos, "key")?;
    let value = blob(data, pos, "value")?;
    headers.clear();
    if byte(data, *pos)? == 0 {
        *pos += 1;
    } else {
        let count = varint(data, pos)?;
        if count < 0 {
            return Err(Malformed(format!("header count {count}")));
        }
        for _ in 0..count {
            let klen = varint(data, pos)?;
            if klen < 0 {
                return Err(Malformed(format!("header key length {klen}")));
            }
            let kspan = span(data, pos, klen)?;
            if std::str::from_utf8(&data[kspan.clone()]).is_err() {
                return Err(Malformed("header key is not UTF-8".into()));
            }
            let vlen = varint(data, pos)?;
            let vspan = if vlen < 0 { None } else { Some(span(data, pos, vlen)?) };
            headers.push((kspan, vspan));
        }
    }
    if *pos != record_end {
        let spanned = *pos as i128 - record_end as i128 + length;
        return Err(Malformed(format!("record declared {length} bytes but its fields span {spanned}")));
    }
    Ok(Fields { ts_delta, off_delta, key, value })
}

#[inline(always)]
fn blob(data: &[u8], pos: &mut usize, what: &str) -> Result<Option<Span>, Malformed> {
    let len = varint(data, pos)?;
    if len >= 0 {
        Ok(Some(span(data, pos, len)?))
    } else if len == -1 {
        Ok(None)
    } else {
        Err(Malformed(format!("{what} length {len}")))
    }
}

/// `len` bytes from `*pos`; a span past the end of the data is malformed (the Python decoder finds it
/// at its next read or at the record's end check).
#[inline(always)]
fn span(data: &[u8], pos: &mut usize, len: i128) -> Result<Span, Malformed> {
    let start = *pos;
    if len > (data.len() - start) as i128 {
        return Err(Malformed(format!("field of {len} bytes runs past the records")));
    }
    *pos = start + len as usize;
    Ok(start..*pos)
}
