package io.github.kafkatiering.spark;

import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.zip.CRC32C;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.compress.Compression;
import org.apache.kafka.common.record.CompressionType;
import org.apache.kafka.common.record.RecordBatch;
import org.apache.kafka.common.utils.BufferSupplier;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.ConstantColumnVector;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * One task's read: the pack's slices in order, as columnar batches of Spark's Kafka source schema.
 *
 * <p>Every batch is checked as {@code reader.spark.slices.decode_slice} checks it (the same order, the same
 * faults): a v2 header of a sane length inside the slice, its CRC-32C, offsets after the batch before it and
 * within the copy's manifest, records that parse to exactly the batch's bytes and count; the slice must end on a
 * batch boundary at its planned end, and a slice that is its whole object has the object's CRC-32C checked
 * against the manifest's. A fault fails the task with a message naming the object's key and the batch's byte
 * position. Control batches and those of aborted transactions are dropped, and only offsets in the slice's range
 * are kept. Kafka's client library decompresses; the records are read here straight from the batch's bytes into
 * the column vectors, with no object per record. Memory: the stream's windows, one decompressed batch and one
 * columnar batch.
 */
final class SlicesReader implements PartitionReader<ColumnarBatch> {
    static final StructType SCHEMA = StructType.fromDDL(
            "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
                    + "timestampType int, headers array<struct<key: string, value: binary>>");
    private static final int LOG_OVERHEAD = 12;
    private static final int HEADER = 61; // a v2 batch's header, up to its records
    private static final int MIN_LENGTH = HEADER - LOG_OVERHEAD;
    private static final long MAX_TIMESTAMP_MS = Long.MAX_VALUE / 1000; // Spark's microseconds hold it

    private final SlicePlan.Pack pack;
    private final SlicePlan.Plan plan;
    private final OnHeapColumnVector[] columns;
    private final UTF8String topic;
    private final BufferSupplier buffers = BufferSupplier.create();
    private final CRC32C batchCrc = new CRC32C();
    private final byte[] headBytes = new byte[HEADER];
    private final Compression[] codecs = new Compression[5];
    private byte[] decompressed = new byte[1 << 20];
    private int next;
    private SliceState slice;
    private ColumnarBatch current;
    private long dataBytes;

    SlicesReader(SlicePlan.Pack pack, SlicePlan.Plan plan) {
        this.pack = pack;
        this.plan = plan;
        this.columns = OnHeapColumnVector.allocateColumns(Math.min(plan.maxRowsPerBatch(), 4096), SCHEMA);
        this.topic = UTF8String.fromString(pack.topic());
    }

    @Override
    public boolean next() throws IOException {
        for (OnHeapColumnVector c : columns) {
            c.reset();
        }
        dataBytes = 0;
        int rows = 0;
        while (rows < plan.maxRowsPerBatch() && dataBytes < plan.maxBatchBytes()) {
            if (slice == null) {
                if (next == pack.slices().size()) {
                    break;
                }
                slice = new SliceState(pack.slices().get(next++), plan);
            }
            if (!readBatch()) {
                slice.finish();
                slice = null;
            }
            rows = columns[4].getElementsAppended();
        }
        if (rows == 0) {
            return false;
        }
        current = batch(rows);
        return true;
    }

    private ColumnarBatch batch(int rows) {
        // the topic's and partition's own vectors stay empty: constant vectors stand in for them
        ColumnVector[] vectors = Arrays.copyOf(columns, columns.length, ColumnVector[].class);
        ConstantColumnVector topicColumn = new ConstantColumnVector(rows, DataTypes.StringType);
        topicColumn.setUtf8String(topic);
        ConstantColumnVector partitionColumn = new ConstantColumnVector(rows, DataTypes.IntegerType);
        partitionColumn.setInt(pack.partition());
        vectors[2] = topicColumn;
        vectors[3] = partitionColumn;
        return new ColumnarBatch(vectors, rows);
    }

    /** Reads, checks and decodes the slice's next Kafka batch; false at the slice's end. */
    private boolean readBatch() throws IOException {
        SlicePlan.Slice s = slice.slice;
        RangeStream in = slice.in;
        long pos = in.position();
        if (pos == s.end()) {
            return false;
        }
        if (s.end() - pos < HEADER) {
            throw corrupt(pos, (s.end() - pos) + " bytes before the slice's end, too few for a batch");
        }
        in.take(HEADER).get(headBytes); // copied: the next take may reuse the stream's buffer
        ByteBuffer head = ByteBuffer.wrap(headBytes);
        int length = head.getInt(8);
        byte magic = head.get(16);
        if (magic != RecordBatch.MAGIC_VALUE_V2) {
            throw corrupt(pos, magic == 0 || magic == 1
                    ? "legacy message format v" + magic + "; only record batches v2 are supported"
                    : "unknown magic byte " + magic);
        }
        if (length < MIN_LENGTH) {
            throw corrupt(pos, "batch length " + length + " is below the minimum " + MIN_LENGTH);
        }
        if (pos + LOG_OVERHEAD + length > s.end()) {
            throw corrupt(pos, "batch of " + (length + LOG_OVERHEAD) + " bytes extends past the slice's end at byte "
                    + s.end());
        }
        long base = head.getLong(0);
        int attributes = head.getShort(21);
        int lastDelta = head.getInt(23);
        long baseTimestamp = head.getLong(27);
        long maxTimestamp = head.getLong(35);
        long producerId = head.getLong(43);
        int count = head.getInt(57);
        long stored = head.getInt(17) & 0xFFFFFFFFL;
        batchCrc.reset();
        batchCrc.update(head.duplicate().position(21));
        if (slice.crc != null) {
            slice.crc.update(head.duplicate());
        }
        ByteBuffer records = in.take(length - MIN_LENGTH);
        batchCrc.update(records.duplicate());
        if (slice.crc != null) {
            slice.crc.update(records.duplicate());
        }
        if (batchCrc.getValue() != stored) {
            throw corrupt(pos, "CRC-32C mismatch: stored " + stored + ", computed " + batchCrc.getValue());
        }
        if ((attributes & 7) > 4) {
            throw corrupt(pos, "unknown compression codec id " + (attributes & 7));
        }
        if (count < 0 || lastDelta < 0) {
            throw corrupt(pos, "negative recordsCount " + count + " or lastOffsetDelta " + lastDelta);
        }
        long last = base + lastDelta;
        if (base <= slice.previous || last > s.endOffset()) {
            throw corrupt(pos, "batch offsets " + base + "-" + last + " are not after " + slice.previous
                    + " and within the copy's " + s.baseOffset() + "-" + s.endOffset());
        }
        slice.previous = last;
        boolean control = (attributes & 0x20) != 0;
        boolean transactional = (attributes & 0x10) != 0;
        boolean wanted = last >= s.firstOffset() && base <= s.lastOffset() && !control
                && !(transactional && slice.aborted.aborts(producerId, base));
        if (wanted) {
            boolean appendTime = (attributes & 0x08) != 0;
            try {
                if ((attributes & 7) == 0) {
                    addRecords(records.array(), records.arrayOffset(), records.arrayOffset() + records.limit(),
                            base, appendTime ? maxTimestamp : baseTimestamp, appendTime, count, s);
                } else {
                    int n = decompress(attributes & 7, records, pos);
                    addRecords(decompressed, 0, n, base, appendTime ? maxTimestamp : baseTimestamp, appendTime,
                            count, s);
                }
            } catch (KafkaException | IndexOutOfBoundsException | IllegalArgumentException e) {
                throw corrupt(pos, "malformed records: " + e.getMessage());
            }
        }
        return true;
    }

    /** The batch's records section decompressed into {@code decompressed}, by Kafka's client library; its length. */
    private int decompress(int codec, ByteBuffer records, long pos) throws IOException {
        if (codecs[codec] == null) {
            codecs[codec] = Compression.of(CompressionType.forId(codec)).build();
        }
        int n = 0;
        try (InputStream in = codecs[codec].wrapForInput(records, RecordBatch.MAGIC_VALUE_V2, buffers)) {
            while (true) {
                if (n == decompressed.length) {
                    decompressed = Arrays.copyOf(decompressed, 2 * decompressed.length);
                }
                int read = in.read(decompressed, n, decompressed.length - n);
                if (read < 0) {
                    return n;
                }
                n += read;
            }
        } catch (IOException | KafkaException e) {
            throw corrupt(pos, "cannot decompress the records: " + e.getMessage());
        }
    }

    /** Appends the records in {@code a[from, to)} (a batch's uncompressed records section). */
    private void addRecords(byte[] a, int from, int to, long base, long timestamp, boolean appendTime, int count,
            SlicePlan.Slice s) {
        Cursor c = new Cursor(a, from, to);
        WritableColumnVector keys = columns[0];
        WritableColumnVector values = columns[1];
        WritableColumnVector offsets = columns[4];
        WritableColumnVector timestamps = columns[5];
        WritableColumnVector types = columns[6];
        WritableColumnVector headers = columns[7];
        for (int i = 0; i < count; i++) {
            int length = c.varint();
            int end = c.pos + length;
            if (length < 6 || end > to) {
                throw new IllegalArgumentException("record length " + length + " out of bounds");
            }
            c.pos++; // attributes (unused)
            long ts = timestamp + (appendTime ? c.skipVarlong() : c.varlong());
            long offset = base + c.varint();
            int keyLength = c.varint();
            int keyAt = c.bytes(keyLength, "key");
            int valueLength = c.varint();
            int valueAt = c.bytes(valueLength, "value");
            int headerCount = c.varint();
            if (headerCount < 0) {
                throw new IllegalArgumentException("header count " + headerCount);
            }
            boolean kept = offset >= s.firstOffset() && offset <= s.lastOffset();
            if (kept) {
                if (ts > MAX_TIMESTAMP_MS || ts < -MAX_TIMESTAMP_MS) {
                    throw new IllegalArgumentException("timestamp out of range");
                }
                append(keys, a, keyAt, keyLength);
                append(values, a, valueAt, valueLength);
                offsets.appendLong(offset);
                timestamps.appendLong(ts * 1000L);
                types.appendInt(appendTime ? 1 : 0);
                dataBytes += Math.max(keyLength, 0) + Math.max(valueLength, 0);
                if (headerCount == 0) {
                    headers.appendNull();
                } else {
                    headers.appendArray(headerCount);
                }
            }
            for (int h = 0; h < headerCount; h++) {
                int nameLength = c.varint();
                if (nameLength < 0) {
                    throw new IllegalArgumentException("header key length " + nameLength);
                }
                int nameAt = c.bytes(nameLength, "header key");
                checkUtf8(a, nameAt, nameLength);
                int headerValueLength = Math.max(c.varint(), -1); // any negative length: null, as Kafka reads it
                int headerValueAt = c.bytes(headerValueLength, "header value");
                if (kept) {
                    WritableColumnVector entries = headers.arrayData();
                    entries.appendStruct(false);
                    entries.getChild(0).appendByteArray(a, nameAt, nameLength);
                    append(entries.getChild(1), a, headerValueAt, headerValueLength);
                    dataBytes += nameLength + Math.max(headerValueLength, 0);
                }
            }
            if (c.pos != end) {
                throw new IllegalArgumentException("record declared " + length + " bytes but its fields span "
                        + (c.pos - end + length));
            }
        }
        if (c.pos != to) {
            throw new IllegalArgumentException((to - c.pos) + " bytes remain after " + count + " records");
        }
    }

    private static void append(WritableColumnVector column, byte[] a, int at, int length) {
        if (length < 0) {
            column.appendNull();
        } else {
            column.appendByteArray(a, at, length);
        }
    }

    private static void checkUtf8(byte[] a, int at, int length) {
        try {
            StandardCharsets.UTF_8.newDecoder().decode(ByteBuffer.wrap(a, at, length));
        } catch (CharacterCodingException e) {
            throw new IllegalArgumentException("a header key that is not UTF-8");
        }
    }

    private IOException corrupt(long position, String reason) {
        return new IOException("remote object " + slice.slice.key() + " at byte " + position + ": " + reason);
    }

    @Override
    public ColumnarBatch get() {
        return current;
    }

    @Override
    public void close() {
        if (slice != null) {
            slice.in.close();
        }
        for (OnHeapColumnVector c : columns) {
            c.close();
        }
        buffers.close();
    }

    /** Zigzag varints of Kafka's record format, read from {@code a} at {@code pos}, never past {@code end}. */
    private static final class Cursor {
        final byte[] a;
        final int end;
        int pos;

        Cursor(byte[] a, int pos, int end) {
            this.a = a;
            this.pos = pos;
            this.end = end;
        }

        int varint() {
            long v = varlong();
            if (v != (int) v) {
                throw new IllegalArgumentException("varint " + v + " out of the int range");
            }
            return (int) v;
        }

        long varlong() {
            long raw = 0;
            for (int shift = 0; shift < 70; shift += 7) {
                if (pos >= end) {
                    throw new IllegalArgumentException("a varint runs past the records' end");
                }
                byte b = a[pos++];
                raw |= (long) (b & 0x7F) << shift;
                if (b >= 0) {
                    return (raw >>> 1) ^ -(raw & 1);
                }
            }
            throw new IllegalArgumentException("a varint longer than 10 bytes");
        }

        long skipVarlong() {
            varlong();
            return 0;
        }

        /** Skips a field of {@code length} bytes (-1: null); where it starts. */
        int bytes(int length, String what) {
            int at = pos;
            if (length < -1 || (length > 0 && length > end - pos)) {
                throw new IllegalArgumentException(what + " length " + length);
            }
            if (length > 0) {
                pos += length;
            }
            return at;
        }
    }

    /** The slice being read: its stream, the offset of the last batch read, the object's running CRC-32C. */
    private final class SliceState {
        final SlicePlan.Slice slice;
        final RangeStream in;
        final AbortedRanges aborted;
        final CRC32C crc;
        long previous;

        SliceState(SlicePlan.Slice slice, SlicePlan.Plan plan) {
            this.slice = slice;
            this.in = new RangeStream(slice.url(), slice.key(), slice.objectSize(), slice.start(), slice.end(),
                    plan.windowBytes(), plan.windowsAhead(), plan.retries());
            this.aborted = new AbortedRanges(slice.aborted());
            this.crc = slice.objectCrc32c() == null ? null : new CRC32C();
            this.previous = slice.baseOffset() - 1;
        }

        void finish() throws IOException {
            in.close();
            if (crc != null && crc.getValue() != slice.objectCrc32c()) {
                throw new IOException("remote object " + slice.key() + " at byte 0: object CRC-32C "
                        + crc.getValue() + " differs from the manifest's " + slice.objectCrc32c());
            }
        }
    }
}
