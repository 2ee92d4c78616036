//! The RecordBatch v2 header, its checks (as `tiering_core.formats.batch.check_header`), the CRC-32C
//! and the decompression of a records section.

use std::io::Read;

pub const HEADER_SIZE: usize = 61;
pub const LOG_OVERHEAD: usize = 12;
pub const MIN_LENGTH: i32 = (HEADER_SIZE - LOG_OVERHEAD) as i32;
const CODECS: [&str; 5] = ["none", "gzip", "snappy", "lz4", "zstd"];
const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";
const XERIAL_HEADER: usize = 16;

/// Which of the Python error classes a header problem maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Format,
    Unsupported,
    Truncated,
}

#[derive(Debug)]
pub struct BadHeader {
    pub kind: Kind,
    pub reason: String,
}

#[derive(Debug, Clone, Copy)]
pub struct Header {
    pub base_offset: i64,
    pub length: i32,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub records_count: i32,
}

impl Header {
    pub fn size(&self) -> usize {
        self.length as usize + LOG_OVERHEAD
    }
    pub fn last_offset(&self) -> i128 {
        self.base_offset as i128 + self.last_offset_delta as i128
    }
    pub fn codec(&self) -> u8 {
        (self.attributes & 7) as u8
    }
    pub fn log_append_time(&self) -> bool {
        self.attributes & 0x08 != 0
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes & 0x10 != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes & 0x20 != 0
    }
}

fn be<const N: usize>(buf: &[u8], pos: usize) -> [u8; N] {
    buf[pos..pos + N].try_into().unwrap()
}

pub fn unpack(buf: &[u8], pos: usize) -> Header {
    Header {
        base_offset: i64::from_be_bytes(be(buf, pos)),
        length: i32::from_be_bytes(be(buf, pos + 8)),
        crc: u32::from_be_bytes(be(buf, pos + 17)),
        attributes: i16::from_be_bytes(be(buf, pos + 21)),
        last_offset_delta: i32::from_be_bytes(be(buf, pos + 23)),
        base_timestamp: i64::from_be_bytes(be(buf, pos + 27)),
        max_timestamp: i64::from_be_bytes(be(buf, pos + 35)),
        producer_id: i64::from_be_bytes(be(buf, pos + 43)),
        records_count: i32::from_be_bytes(be(buf, pos + 57)),
    }
}

fn bad(kind: Kind, reason: String) -> BadHeader {
    BadHeader { kind, reason }
}

/// The header at `pos` of `buf[..end]`, validated; None at the end of data (nothing left, fewer than
/// 17 bytes of zeros, or a zero length field).
pub fn check_header(buf: &[u8], pos: usize, end: usize) -> Result<Option<Header>, BadHeader> {
    if pos >= end {
        return Ok(None);
    }
    let remaining = end - pos;
    if remaining < 17 {
        if buf[pos..end].iter().all(|&b| b == 0) {
            return Ok(None);
        }
        return Err(bad(Kind::Truncated, format!("{remaining} trailing bytes, too few for a batch header")));
    }
    let length = i32::from_be_bytes(be(buf, pos + 8));
    if length == 0 {
        return Ok(None);
    }
    let magic = buf[pos + 16];
    if magic == 0 || magic == 1 {
        return Err(bad(
            Kind::Unsupported,
            format!("legacy message format v{magic} (magic {magic}); only record batches v2 are supported"),
        ));
    }
    if magic != 2 {
        return Err(bad(Kind::Format, format!("unknown magic byte {magic}")));
    }
    if length < MIN_LENGTH {
        return Err(bad(Kind::Format, format!("batch length {length} is below the minimum {MIN_LENGTH}")));
    }
    if pos + LOG_OVERHEAD + length as usize > end {
        return Err(bad(
            Kind::Truncated,
            format!("batch of {} bytes extends past the end of data at byte {end}", length as i64 + 12),
        ));
    }
    let header = unpack(buf, pos);
    if header.codec() > 4 {
        return Err(bad(Kind::Format, format!("unknown compression codec id {}", header.codec())));
    }
    if header.records_count < 0 || header.last_offset_delta < 0 {
        return Err(bad(
            Kind::Format,
            format!(
                "negative recordsCount {} or lastOffsetDelta {}",
                header.records_count, header.last_offset_delta
            ),
        ));
    }
    Ok(Some(header))
}

/// CRC-32C of the batch at `pos` (attributes to its end) compared with the stored one.
pub fn check_crc(buf: &[u8], pos: usize, length: usize, stored: u32) -> Result<(), String> {
    let actual = crc32c::crc32c(&buf[pos + 21..pos + LOG_OVERHEAD + length]);
    if actual != stored {
        return Err(format!("CRC-32C mismatch: stored {stored}, computed {actual}"));
    }
    Ok(())
}

/// The uncompressed records section (`codec` 1-4), or the reason it cannot be had.
pub fn decompress(codec: u8, data: &[u8]) -> Result<Vec<u8>, String> {
    let result = match codec {
        1 => gzip(data),
        2 => snappy(data),
        3 => crate::lz4::decompress(data),
        4 => zstd::stream::decode_all(data).map_err(|e| e.to_string()),
        _ => return Err(format!("unknown compression codec id {codec}")),
    };
    result.map_err(|e| format!("{} decompression failed: {e}", CODECS[codec as usize]))
}

fn gzip(data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(data.len() * 4);
    flate2::read::MultiGzDecoder::new(data).read_to_end(&mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

fn snappy(data: &[u8]) -> Result<Vec<u8>, String> {
    let mut decoder = snap::raw::Decoder::new();
    let mut out = Vec::new();
    if !data.starts_with(XERIAL_MAGIC) {
        raw_snappy(&mut decoder, data, &mut out)?;
        return Ok(out);
    }
    let mut pos = XERIAL_HEADER;
    let end = data.len();
    while pos < end {
        if end - pos < 4 {
            return Err("snappy block length cut short".into());
        }
        let size = u32::from_be_bytes(be(data, pos)) as usize;
        pos += 4;
        if size > end - pos {
            return Err(format!("snappy block of {size} bytes extends past the records"));
        }
        raw_snappy(&mut decoder, &data[pos..pos + size], &mut out)?;
        pos += size;
    }
    Ok(out)
}

/// One raw snappy block appended to `out`.
fn raw_snappy(decoder: &mut snap::raw::Decoder, block: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let n = snap::raw::decompress_len(block).map_err(|e| e.to_string())?;
    if n > 32 * block.len() + 64 {
        // beyond snappy's best ratio: a damaged preamble, not a length to allocate for
        return Err(format!("snappy block of {} bytes claims {n} bytes uncompressed", block.len()));
    }
    let start = out.len();
    out.resize(start + n, 0);
    decoder.decompress(block, &mut out[start..]).map_err(|e| e.to_string())?;
    Ok(())
}

