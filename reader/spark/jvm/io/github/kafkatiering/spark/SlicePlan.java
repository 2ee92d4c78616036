package io.github.kafkatiering.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.connector.read.InputPartition;

/**
 * The plan the Python driver made ({@code reader.spark.jvm_source}): input partitions of consecutive slices of one
 * topic partition, each slice a byte range of one remote copy's {@code .log} with the rules to read it by. The
 * driver chose the copies, the byte ranges (batch boundaries) and the aborted transactions on the one read core
 * every reader shares; this side only reads the bytes, checks them and builds columns.
 */
final class SlicePlan {
    private SlicePlan() {}

    /** Bytes {@code [start, end)} of the object at {@code url} (named {@code key} in errors). */
    record Slice(
            String url,
            String key,
            long start,
            long end,
            long firstOffset,
            long lastOffset,
            long baseOffset,
            long endOffset,
            long objectSize,
            Long objectCrc32c,
            long[][] aborted)
            implements Serializable {}

    /** One task: slices of one topic partition, read one after the other. */
    record Pack(String topic, int partition, List<Slice> slices) implements InputPartition, Serializable {}

    record Plan(List<Pack> packs, int maxRowsPerBatch, long maxBatchBytes, int windowBytes, int windowsAhead,
            int retries) implements Serializable {
        Plan withoutPacks() {
            return new Plan(List.of(), maxRowsPerBatch, maxBatchBytes, windowBytes, windowsAhead, retries);
        }
    }

    static Plan parse(String json) {
        try {
            JsonNode root = new ObjectMapper().readTree(json);
            List<Pack> packs = new ArrayList<>();
            for (JsonNode p : root.get("packs")) {
                List<Slice> slices = new ArrayList<>();
                for (JsonNode s : p.get("slices")) {
                    JsonNode ranges = s.get("aborted");
                    long[][] aborted = new long[ranges.size()][];
                    for (int i = 0; i < aborted.length; i++) {
                        JsonNode r = ranges.get(i);
                        aborted[i] = new long[] {r.get(0).asLong(), r.get(1).asLong(), r.get(2).asLong()};
                    }
                    JsonNode crc = s.get("object_crc32c");
                    slices.add(new Slice(
                            s.get("url").asText(), s.get("key").asText(), s.get("start").asLong(),
                            s.get("end").asLong(), s.get("first_offset").asLong(), s.get("last_offset").asLong(),
                            s.get("base_offset").asLong(), s.get("end_offset").asLong(), s.get("object_size").asLong(),
                            crc == null || crc.isNull() ? null : crc.asLong(), aborted));
                }
                packs.add(new Pack(p.get("topic").asText(), p.get("partition").asInt(), slices));
            }
            return new Plan(packs, root.get("max_rows_per_batch").asInt(), root.get("max_batch_bytes").asLong(),
                    root.get("window_bytes").asInt(), root.get("windows_ahead").asInt(), root.get("retries").asInt());
        } catch (IOException e) {
            throw new UncheckedIOException("kafka_tiered_slices: the option '" + TieredSlicesSource.PLAN_OPTION
                    + "' is not the driver's JSON plan", e);
        }
    }
}
