package io.github.kafkatiering.spark;

import java.util.Arrays;
import java.util.Comparator;
import java.util.HashMap;
import java.util.Map;

/**
 * Whether a transactional batch belongs to an aborted transaction, batch by batch in offset order: the rule of
 * {@code reader.txn.AbortedRanges} (and {@code native/src/columns.rs}), which the differential tests hold the
 * readers to. A batch of producer P at base offset B is aborted when an aborted transaction of P has
 * {@code first <= B <= last} (its ABORT marker's offset); the driver gave the ranges, from the transaction indexes.
 */
final class AbortedRanges {
    private final long[][] ranges;
    private final Map<Long, Long> open = new HashMap<>();
    private int next;

    AbortedRanges(long[][] ranges) {
        this.ranges = ranges.clone();
        Arrays.sort(this.ranges, Comparator.comparingLong(r -> r[1]));
    }

    boolean aborts(long producerId, long baseOffset) {
        while (next < ranges.length && ranges[next][1] <= baseOffset) {
            open.put(ranges[next][0], ranges[next][2]);
            next++;
        }
        Long last = open.get(producerId);
        return last != null && baseOffset <= last;
    }
}
