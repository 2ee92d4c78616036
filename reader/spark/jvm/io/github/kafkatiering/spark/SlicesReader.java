package io.github.kafkatiering.spark;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.zip.CRC32C;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.record.MemoryRecords;
import org.apache.kafka.common.record.Record;
import org.apache.kafka.common.record.RecordBatch;
import org.apache.kafka.common.record.TimestampType;
import org.apache.kafka.common.utils.BufferSupplier;
import org.apache.kafka.common.utils.CloseableIterator;
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
 * faults): a v2 header of a sane length inside the slice, its CRC-32C (Kafka's {@code ensureValid}), offsets
 * after the batch before it and within the copy's manifest, records that parse; the slice must end on a batch
 * boundary at its planned end, and a slice that is its whole object has the object's CRC-32C checked against the
 * manifest's. A fault fails the task with a message naming the object's key and the batch's byte position.
 * Control batches and those of aborted transactions are dropped, and only offsets in the slice's range are kept.
 * Records are decoded by Kafka's own client library; memory is one Kafka batch plus one columnar batch.
 */
final class SlicesReader implements PartitionReader<ColumnarBatch> {
    static final StructType SCHEMA = StructType.fromDDL(
            "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
                    + "timestampType int, headers array<struct<key: string, value: binary>>");
    private static final int LOG_OVERHEAD = 12;
    private static final int MIN_LENGTH = 49;

    private final SlicePlan.Pack pack;
    private final SlicePlan.Plan plan;
    private final OnHeapColumnVector[] columns;
    private final UTF8String topic;
    private final BufferSupplier buffers = BufferSupplier.create();
    private byte[] batchBytes = new byte[1 << 20];
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
                slice = new SliceState(pack.slices().get(next++), plan.retries());
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
        if (s.end() - pos < LOG_OVERHEAD + MIN_LENGTH) {
            throw corrupt(pos, (s.end() - pos) + " bytes before the slice's end, too few for a batch");
        }
        in.readFully(batchBytes, 0, LOG_OVERHEAD + 5);
        ByteBuffer head = ByteBuffer.wrap(batchBytes);
        int length = head.getInt(8);
        byte magic = batchBytes[16];
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
        int size = LOG_OVERHEAD + length;
        if (size > batchBytes.length) {
            batchBytes = Arrays.copyOf(batchBytes, Math.max(size, 2 * batchBytes.length));
        }
        in.readFully(batchBytes, LOG_OVERHEAD + 5, size - LOG_OVERHEAD - 5);
        if (slice.crc != null) {
            slice.crc.update(batchBytes, 0, size);
        }
        long stored = ByteBuffer.wrap(batchBytes).getInt(17) & 0xFFFFFFFFL;
        CRC32C crc = new CRC32C();
        crc.update(batchBytes, 21, size - 21);
        if (crc.getValue() != stored) {
            throw corrupt(pos, "CRC-32C mismatch: stored " + stored + ", computed " + crc.getValue());
        }
        RecordBatch batch = MemoryRecords.readableRecords(ByteBuffer.wrap(batchBytes, 0, size))
                .batches().iterator().next();
        long base = batch.baseOffset();
        long last = batch.lastOffset();
        if (base <= slice.previous || last > s.endOffset()) {
            throw corrupt(pos, "batch offsets " + base + "-" + last + " are not after " + slice.previous
                    + " and within the copy's " + s.baseOffset() + "-" + s.endOffset());
        }
        slice.previous = last;
        boolean wanted = last >= s.firstOffset() && base <= s.lastOffset() && !batch.isControlBatch()
                && !(batch.isTransactional() && slice.aborted.aborts(batch.producerId(), base));
        if (wanted) {
            try {
                addRecords(batch, s);
            } catch (KafkaException | IndexOutOfBoundsException | IllegalArgumentException e) {
                throw corrupt(pos, "malformed records: " + e.getMessage());
            }
        }
        return true;
    }

    private void addRecords(RecordBatch batch, SlicePlan.Slice s) {
        int timestampType = batch.timestampType() == TimestampType.LOG_APPEND_TIME ? 1 : 0;
        WritableColumnVector key = columns[0];
        WritableColumnVector value = columns[1];
        WritableColumnVector headers = columns[7];
        try (CloseableIterator<Record> records = batch.streamingIterator(buffers)) {
            while (records.hasNext()) {
                Record r = records.next();
                long offset = r.offset();
                if (offset < s.firstOffset() || offset > s.lastOffset()) {
                    continue;
                }
                dataBytes += append(key, r.key()) + append(value, r.value());
                columns[4].appendLong(offset);
                columns[5].appendLong(r.timestamp() * 1000L);
                columns[6].appendInt(timestampType);
                Header[] hs = r.headers();
                if (hs.length == 0) {
                    headers.appendNull();
                    continue;
                }
                headers.appendArray(hs.length);
                WritableColumnVector entries = headers.arrayData();
                for (Header h : hs) {
                    entries.appendStruct(false);
                    byte[] name = h.key().getBytes(StandardCharsets.UTF_8);
                    entries.getChild(0).appendByteArray(name, 0, name.length);
                    byte[] v = h.value();
                    if (v == null) {
                        entries.getChild(1).appendNull();
                    } else {
                        entries.getChild(1).appendByteArray(v, 0, v.length);
                    }
                    dataBytes += name.length + (v == null ? 0 : v.length);
                }
            }
        }
    }

    private static int append(WritableColumnVector column, ByteBuffer bytes) {
        if (bytes == null) {
            column.appendNull();
            return 0;
        }
        int n = bytes.remaining();
        if (bytes.hasArray()) {
            column.appendByteArray(bytes.array(), bytes.arrayOffset() + bytes.position(), n);
        } else {
            byte[] copy = new byte[n];
            bytes.duplicate().get(copy);
            column.appendByteArray(copy, 0, n);
        }
        return n;
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

    /** The slice being read: its stream, the offset of the last batch read, the object's running CRC-32C. */
    private final class SliceState {
        final SlicePlan.Slice slice;
        final RangeStream in;
        final AbortedRanges aborted;
        final CRC32C crc;
        long previous;

        SliceState(SlicePlan.Slice slice, int retries) {
            this.slice = slice;
            this.in = new RangeStream(slice.url(), slice.key(), slice.objectSize(), slice.start(), slice.end(), retries);
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
