//! LZ4 frames (the format of Kafka's lz4 codec), decoded block by block straight into the output.
//!
//! Kafka's Java producer (KafkaLZ4BlockOutputStream) and librdkafka write one frame per batch, of
//! independent blocks of at most 64 KiB, without checksums. `lz4_flex`'s FrameDecoder decoded each
//! block into a buffer of its own and copied it out through `Read`, and it ended quietly where a frame
//! was cut at a block boundary. Here the frame's block table is read first (which bounds the output: a
//! block decompresses to at most the frame's block size), then each block is checked and decompressed
//! in place. Every frame layout is read: content size, block and content checksums (xxHash-32), linked
//! blocks (the previous 64 KiB of output as the dictionary). Like python-lz4 (the reference decoder's
//! library) and Kafka's consumers, only the first frame is read; bytes after its end mark are ignored.

use std::hash::Hasher;
use twox_hash::XxHash32;

const MAGIC: [u8; 4] = [0x04, 0x22, 0x4D, 0x18];
const STORED: u32 = 0x8000_0000;
const WINDOW: usize = 64 << 10; // how far back a match of a linked block may reach

struct Block<'a> {
    data: &'a [u8],
    stored: bool,
    checksum: Option<u32>,
}

/// A parsed frame: its blocks and the largest output size (`bound`).
pub struct Frame<'a> {
    blocks: Vec<Block<'a>>,
    block_max: usize,
    linked: bool,
    content_size: Option<u64>,
    content_checksum: Option<u32>,
    pub bound: usize,
}

fn xxh32(data: &[u8]) -> u32 {
    let mut hasher = XxHash32::with_seed(0);
    hasher.write(data);
    hasher.finish() as u32
}

fn le32(data: &[u8], pos: usize) -> Result<u32, String> {
    match data.get(pos..pos + 4) {
        Some(b) => Ok(u32::from_le_bytes(b.try_into().unwrap())),
        None => Err(format!("LZ4 frame cut short at byte {pos} of {}", data.len())),
    }
}

impl<'a> Frame<'a> {
    /// The frame at the start of `data`: its descriptor checked, its blocks located (not decoded).
    pub fn parse(data: &'a [u8]) -> Result<Frame<'a>, String> {
        if data.len() < 7 {
            return Err(format!("LZ4 frame header cut short ({} bytes)", data.len()));
        }
        if data[..4] != MAGIC {
            return Err(format!("not an LZ4 frame (magic {:02x?})", &data[..4]));
        }
        let (flg, bd) = (data[4], data[5]);
        if flg >> 6 != 1 {
            return Err(format!("LZ4 frame version {} is not 1", flg >> 6));
        }
        if flg & 0x03 != 0 || bd & 0x8F != 0 {
            return Err("LZ4 frame descriptor has reserved bits set or a dictionary id".into());
        }
        let block_max = match (bd >> 4) & 7 {
            4 => 64 << 10,
            5 => 256 << 10,
            6 => 1 << 20,
            7 => 4 << 20,
            n => return Err(format!("LZ4 block size code {n} is not 4-7")),
        };
        let (block_checksums, content_checksum) = (flg & 0x10 != 0, flg & 0x04 != 0);
        let mut pos = 6;
        let mut content_size = None;
        if flg & 0x08 != 0 {
            let bytes = data.get(6..14).ok_or("LZ4 frame header cut short")?;
            content_size = Some(u64::from_le_bytes(bytes.try_into().unwrap()));
            pos = 14;
        }
        let stated = *data.get(pos).ok_or("LZ4 frame header cut short")?;
        if stated != (xxh32(&data[4..pos]) >> 8) as u8 {
            return Err("LZ4 frame header checksum mismatch".into());
        }
        pos += 1;
        let mut blocks = Vec::with_capacity(data.len() / block_max + 1);
        let mut bound = 0usize;
        loop {
            let size = le32(data, pos)?;
            pos += 4;
            if size == 0 {
                break;
            }
            let n = (size & !STORED) as usize;
            if n > block_max {
                return Err(format!("LZ4 block of {n} bytes is over the frame's block size {block_max}"));
            }
            let block = data.get(pos..pos + n).ok_or_else(|| format!("LZ4 block of {n} bytes cut short"))?;
            pos += n;
            let checksum = if block_checksums {
                pos += 4;
                Some(le32(data, pos - 4)?)
            } else {
                None
            };
            let stored = size & STORED != 0;
            blocks.push(Block { data: block, stored, checksum });
            bound += if stored { n } else { block_max };
        }
        let content_checksum = if content_checksum { Some(le32(data, pos)?) } else { None };
        Ok(Frame { blocks, block_max, linked: flg & 0x20 == 0, content_size, content_checksum, bound })
    }

    /// Decode into `out` (at least `bound` bytes long); the decompressed length.
    pub fn decode_into(&self, out: &mut [u8]) -> Result<usize, String> {
        let mut w = 0;
        for (i, block) in self.blocks.iter().enumerate() {
            if let Some(sum) = block.checksum {
                if xxh32(block.data) != sum {
                    return Err(format!("LZ4 block {i} checksum mismatch"));
                }
            }
            if block.stored {
                out[w..w + block.data.len()].copy_from_slice(block.data);
                w += block.data.len();
                continue;
            }
            let end = out.len().min(w + self.block_max);
            let (before, rest) = out.split_at_mut(w);
            let target = &mut rest[..end - w];
            let decoded = if self.linked && w > 0 {
                lz4_flex::block::decompress_into_with_dict(block.data, target, &before[w.saturating_sub(WINDOW)..])
            } else {
                lz4_flex::block::decompress_into(block.data, target)
            };
            w += decoded.map_err(|e| format!("LZ4 block {i}: {e}"))?;
        }
        if let Some(size) = self.content_size {
            if size != w as u64 {
                return Err(format!("LZ4 frame states {size} bytes, its blocks hold {w}"));
            }
        }
        if let Some(sum) = self.content_checksum {
            if xxh32(&out[..w]) != sum {
                return Err("LZ4 frame content checksum mismatch".into());
            }
        }
        Ok(w)
    }
}

/// The decompressed frame at the start of `data`.
pub fn decompress(data: &[u8]) -> Result<Vec<u8>, String> {
    let frame = Frame::parse(data)?;
    let mut out = vec![0u8; frame.bound];
    let n = frame.decode_into(&mut out)?;
    out.truncate(n);
    Ok(out)
}
