package io.github.kafkatiering.spark;

import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * {@code format("kafka_tiered_slices")}: the JVM reader of a plan the Python driver made
 * ({@code reader.spark.jvm_source.load}), given whole as the JSON option {@code planWithSignedUrls}. A DataSource V2 with
 * columnar reads: each task reads its slices' bytes from the store and hands Spark column vectors, with no Python
 * worker and no Arrow hand-over between processes (the path a Python data source cannot leave). Users do not
 * name this format: {@code tiering export} and {@code reader.spark.jvm_source.load} plan and load it.
 */
public final class TieredSlicesSource implements TableProvider, DataSourceRegister {
    /**
     * The option holding the plan. Its signed URLs let anyone read those objects for hours: Spark does not print a
     * V2 read's options in its plans, and should anything print them, the name matches Spark's
     * {@code spark.sql.redaction.options.regex} (default {@code (?i)url}), which redacts it.
     */
    static final String PLAN_OPTION = "planWithSignedUrls";

    @Override
    public String shortName() {
        return "kafka_tiered_slices";
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return SlicesReader.SCHEMA;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        String json = properties.get(PLAN_OPTION);
        if (json == null) {
            throw new IllegalArgumentException("kafka_tiered_slices: the option '" + PLAN_OPTION
                    + "' is required (the driver's plan)");
        }
        return new SlicesTable(SlicePlan.parse(json));
    }

    private record SlicesTable(SlicePlan.Plan plan) implements Table, SupportsRead {
        @Override
        public String name() {
            return "kafka_tiered_slices";
        }

        @Override
        @SuppressWarnings("deprecation") // Table.columns() is built from it by default
        public StructType schema() {
            return SlicesReader.SCHEMA;
        }

        @Override
        public Set<TableCapability> capabilities() {
            return Set.of(TableCapability.BATCH_READ);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            return () -> new SlicesScan(plan);
        }
    }

    private record SlicesScan(SlicePlan.Plan plan) implements Scan, Batch {
        @Override
        public StructType readSchema() {
            return SlicesReader.SCHEMA;
        }

        @Override
        public Batch toBatch() {
            return this;
        }

        @Override
        public InputPartition[] planInputPartitions() {
            return plan.packs().toArray(new InputPartition[0]);
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            return new ReaderFactory(plan.withoutPacks());
        }
    }

    /** Sent to the executors: the plan's limits only (each task's slices travel in its input partition). */
    private record ReaderFactory(SlicePlan.Plan limits) implements PartitionReaderFactory {
        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return true;
        }

        @Override
        public PartitionReader<org.apache.spark.sql.catalyst.InternalRow> createReader(InputPartition partition) {
            throw new UnsupportedOperationException("kafka_tiered_slices reads columnar batches only");
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            return new SlicesReader((SlicePlan.Pack) partition, limits);
        }
    }
}
