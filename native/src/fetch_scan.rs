//! A broker's Fetch answer, and a client's Fetch request, walked by the lengths they carry, for the proxy
//! (`reader/proxy/fetch_scan.py`, `reader/proxy/fetch_request.py`).
//!
//! The Python walks (`fetch_walk` driven by `walk_fetch`; `fetch_request._layout`) are the reference: these read
//! the same fields of the same versions (Kafka's FetchResponse.json and FetchRequest.json v4-18, from the body) and
//! fail on the same inputs (tests/unit/test_native_fetch_scan.py holds them together, broken frames included).
//! What fails, and why, is only said in words: the caller raises its own ProtocolError.

/// One partition's header: index, error, high watermark, last stable offset, log start (-1 before v5), the
/// records' size and where they begin.
pub struct Partition {
    pub topic: usize,
    pub index: i32,
    pub error: i16,
    pub high_watermark: i64,
    pub last_stable: i64,
    pub log_start: i64,
    pub records: usize,
    pub records_at: usize,
}

/// A topic as the answer names it: its id (v13+) or its name.
pub enum Topic<'a> {
    Id(&'a [u8]),
    Name(&'a str),
}

pub struct Scan<'a> {
    pub error: i16,
    pub tagged: bool,
    pub topics: Vec<Topic<'a>>,
    pub partitions: Vec<Partition>,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

type Fail = String;

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Fail> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or("the answer ends inside a field")?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn skip(&mut self, n: usize) -> Result<(), Fail> {
        // Unchecked against the end, as the reference: the next read (or the end check) fails instead.
        self.pos = self.pos.checked_add(n).ok_or("a length overflows")?;
        Ok(())
    }

    fn i16(&mut self) -> Result<i16, Fail> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into().unwrap()))
    }

    fn i32(&mut self) -> Result<i32, Fail> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn i64(&mut self) -> Result<i64, Fail> {
        Ok(i64::from_be_bytes(self.take(8)?.try_into().unwrap()))
    }

    /// An unsigned varint of at most five bytes (`wire.uvarint`).
    fn uvarint(&mut self) -> Result<u64, Fail> {
        let (mut value, mut shift) = (0u64, 0u32);
        loop {
            if self.pos >= self.buf.len() || shift > 28 {
                return Err("malformed unsigned varint".into());
            }
            let b = self.buf[self.pos];
            self.pos += 1;
            value |= u64::from(b & 0x7F) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
            shift += 7;
        }
    }

    /// An array's count or a string's or records' length (0 for null): compact (n + 1 as a varint) in the flexible
    /// versions, else an int32 (`wire.array_length`) or, for strings, an int16 (`wire.string_length`).
    fn length(&mut self, flexible: bool, short: bool) -> Result<usize, Fail> {
        let n = if flexible {
            self.uvarint()? as i64 - 1
        } else if short {
            i64::from(self.i16()?)
        } else {
            i64::from(self.i32()?)
        };
        Ok(n.max(0) as usize)
    }

    /// A topic as a Fetch answer or request names it: 16 bytes of id (v13+), else a name (compact from v12).
    fn topic(&mut self, version: i16) -> Result<Topic<'a>, Fail> {
        if version >= 13 {
            return Ok(Topic::Id(self.take(16).map_err(|_| "a topic id ends after the frame")?));
        }
        let size = self.length(version >= 12, true)?;
        let name = self.take(size).map_err(|_| "a topic name ends after the frame")?;
        Ok(Topic::Name(
            std::str::from_utf8(name).map_err(|e| format!("a topic name is not UTF-8: {e}"))?,
        ))
    }

    /// A Fetch answer's or request's topics array: each topic's id or name, then `partition` for each of its
    /// partitions (given the topic's index), then (flexible versions) the topic's tagged fields.
    fn topics(
        &mut self,
        version: i16,
        mut partition: impl FnMut(&mut Self, usize) -> Result<(), Fail>,
    ) -> Result<Vec<Topic<'a>>, Fail> {
        let flexible = version >= 12;
        let mut topics = Vec::new();
        for t in 0..self.length(flexible, false)? {
            topics.push(self.topic(version)?);
            for _ in 0..self.length(flexible, false)? {
                partition(self, t)?;
            }
            if flexible {
                self.tagged()?;
            }
        }
        Ok(topics)
    }

    /// A tagged-field section skipped (`wire.skip_tagged_fields`: not checked against the end).
    fn skip_tagged(&mut self) -> Result<(), Fail> {
        let count = self.uvarint()?;
        for _ in 0..count {
            self.uvarint()?;
            let size = self.uvarint()? as usize;
            self.skip(size)?;
        }
        Ok(())
    }

    /// A tagged-field section skipped, then checked not to end after the answer (`fetch_scan._tagged`).
    fn tagged(&mut self) -> Result<(), Fail> {
        self.skip_tagged()?;
        if self.pos > self.buf.len() {
            return Err("tagged fields end after the answer".into());
        }
        Ok(())
    }
}

/// The answer's partition headers from `start` (its body), for a Fetch answer of `version` received whole.
pub fn scan(buf: &[u8], version: i16, start: usize) -> Result<Scan<'_>, Fail> {
    let flexible = version >= 12;
    let mut c = Cursor { buf, pos: start };
    if c.pos > buf.len() {
        return Err("the answer ends before its body".into());
    }
    c.i32()?; // throttle_time_ms
    let mut error = 0;
    if version >= 7 {
        error = c.i16()?;
        c.i32()?; // session_id
    }
    let mut partitions = Vec::new();
    let topics = c.topics(version, |c, t| {
        let index = c.i32()?;
        let error = c.i16()?;
        let high_watermark = c.i64()?;
        let last_stable = c.i64()?;
        let log_start = if version >= 5 { c.i64()? } else { -1 };
        let aborted = c.length(flexible, false)?;
        if flexible {
            for _ in 0..aborted {
                c.skip(16)?; // producer_id, first_offset
                c.tagged()?;
            }
        } else {
            c.skip(aborted.checked_mul(16).ok_or("a length overflows")?)?;
        }
        if version >= 11 {
            c.skip(4)?; // preferred_read_replica
        }
        let records = c.length(flexible, false)?;
        if c.pos > c.buf.len() {
            return Err("a partition header ends after the answer".into());
        }
        partitions.push(Partition {
            topic: t,
            index,
            error,
            high_watermark,
            last_stable,
            log_start,
            records,
            records_at: c.pos,
        });
        c.skip(records)?;
        if flexible {
            c.tagged()?;
        }
        Ok(())
    })?;
    let mut tagged = false;
    if flexible {
        let mut peek = Cursor { buf, pos: c.pos };
        tagged = peek.uvarint()? > 0;
        c.tagged()?;
    }
    if c.pos != buf.len() {
        let after = if c.pos > buf.len() {
            "fewer".to_string()
        } else {
            (buf.len() - c.pos).to_string()
        };
        return Err(format!("{after} bytes after its fields"));
    }
    Ok(Scan {
        error,
        tagged,
        topics,
        partitions,
    })
}

/// Where one partition's fields are in a Fetch request: index, fetch_offset, last_fetched_epoch (0 before v12:
/// none), partition_max_bytes, and where the partition begins and ends.
pub struct PartitionAt {
    pub topic: usize,
    pub index: i32,
    pub offset: usize,
    pub epoch: Option<usize>,
    pub max_bytes: usize,
    pub start: usize,
    pub end: usize,
}

pub struct Layout<'a> {
    pub max_wait: usize,
    pub session: Option<usize>,
    pub topics: Vec<Topic<'a>>,
    pub partitions: Vec<PartitionAt>,
    pub forgotten: usize,
    pub topics_at: usize,
    pub topics_end: usize,
}

/// The positions of a Fetch request's fields, its body at `start` (`fetch_request._layout`).
pub fn layout(buf: &[u8], version: i16, start: usize) -> Result<Layout<'_>, Fail> {
    let flexible = version >= 12;
    let mut c = Cursor { buf, pos: start };
    if version <= 14 {
        c.skip(4)?; // replica_id
    }
    let max_wait = c.pos;
    c.skip(13)?; // max_wait, min_bytes, max_bytes, isolation_level
    let mut session = None;
    if version >= 7 {
        session = Some(c.pos);
        c.skip(8)?;
    }
    let topics_at = c.pos;
    let mut partitions = Vec::new();
    let topics = c.topics(version, |c, t| {
        let start = c.pos;
        let index = c.i32()?;
        if version >= 9 {
            c.skip(4)?; // current_leader_epoch
        }
        let offset = c.pos;
        c.skip(8)?;
        let mut epoch = None;
        if version >= 12 {
            epoch = Some(c.pos);
            c.skip(4)?;
        }
        if version >= 5 {
            c.skip(8)?; // log_start_offset
        }
        let max_bytes = c.pos;
        c.i32()?;
        if flexible {
            c.skip_tagged()?;
        }
        partitions.push(PartitionAt {
            topic: t,
            index,
            offset,
            epoch,
            max_bytes,
            start,
            end: c.pos,
        });
        Ok(())
    })?;
    let topics_end = c.pos;
    let forgotten = if version >= 7 { c.length(flexible, false)? } else { 0 };
    Ok(Layout {
        max_wait,
        session,
        topics,
        partitions,
        forgotten,
        topics_at,
        topics_end,
    })
}

/// Where a Fetch request's body begins in its frame (after the size prefix): request header v1 (api key, version,
/// correlation id, nullable client id), plus its tagged fields from v12 (header v2).
pub fn request_body_start(buf: &[u8], version: i16) -> Result<usize, Fail> {
    let mut c = Cursor { buf, pos: 8 };
    if buf.len() < 10 {
        return Err("the request ends inside its header".into());
    }
    let client_id = c.i16()?;
    c.skip(client_id.max(0) as usize)?;
    if version >= 12 {
        c.tagged()?;
    }
    if c.pos > buf.len() {
        return Err("the request ends inside its header".into());
    }
    Ok(c.pos)
}

/// Where a Fetch answer's body begins in its frame (after the size prefix): the correlation id, plus its tagged
/// fields from v12 (response header v1).
pub fn response_body_start(buf: &[u8], version: i16) -> Result<usize, Fail> {
    let mut c = Cursor { buf, pos: 0 };
    c.i32()?;
    if version >= 12 {
        c.tagged()?;
    }
    Ok(c.pos)
}
