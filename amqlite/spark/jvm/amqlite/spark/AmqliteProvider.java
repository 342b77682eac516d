package amqlite.spark;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code format("amqlite")} on the JVM: batch reads of a stream queue run here
 * ({@link FetchBatch}: {@code stream.fetch} replies straight into column vectors),
 * and batch writes ({@link Writer}: {@code publish.columns} frames with confirms);
 * streaming reads and writes, and batch reads and writes over TLS or with
 * {@code fetch} false or columns the JVM writer does not take, go
 * to the Python data source, which {@code amqlite.spark.register} registers as
 * {@value #PYTHON_NAME}.
 */
public final class AmqliteProvider implements TableProvider, DataSourceRegister {
    public static final String NAME = "amqlite";
    public static final String PYTHON_NAME = "amqlite_python";

    static final StructType READ_SCHEMA = new StructType(new StructField[] {
        field("offset", DataTypes.LongType),
        field("exchange", DataTypes.StringType),
        field("routing_key", DataTypes.StringType),
        field("headers", DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType)),
        field("body", DataTypes.BinaryType),
        field("timestamp", DataTypes.TimestampType),
        field("message_id", DataTypes.StringType),
        field("correlation_id", DataTypes.StringType),
        field("content_type", DataTypes.StringType),
    });

    private static StructField field(String name, org.apache.spark.sql.types.DataType type) {
        return new StructField(name, type, true, Metadata.empty());
    }

    @Override
    public String shortName() {
        return NAME;
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return READ_SCHEMA;
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true; // writes take the DataFrame's schema
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        return new AmqliteTable(schema, partitioning, properties);
    }

    static final class AmqliteTable implements Table, SupportsRead, SupportsWrite {
        private final StructType schema;
        private final Transform[] partitioning;
        private final Map<String, String> properties;
        private Table python;

        AmqliteTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
            this.schema = schema;
            this.partitioning = partitioning;
            this.properties = properties;
        }

        /** The Python source's table for the same options (streaming, writes). */
        synchronized Table python() {
            if (python == null) {
                PythonDataSourceV2 ds = new PythonDataSourceV2();
                ds.setShortName(PYTHON_NAME);
                python = ds.getTable(schema, partitioning, properties);
            }
            return python;
        }

        @Override
        public String name() {
            return NAME;
        }

        @Override
        public StructType schema() {
            return schema;
        }

        @Override
        public Set<TableCapability> capabilities() {
            return EnumSet.of(
                    TableCapability.BATCH_READ,
                    TableCapability.MICRO_BATCH_READ,
                    TableCapability.BATCH_WRITE,
                    TableCapability.STREAMING_WRITE);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            return () -> new AmqliteScan(this, options);
        }

        /** Batch writes of the columns the JVM writer takes ({@link Writer.Plan#handles})
         * run in the JVM, unless over TLS; everything else, and streaming writes, in
         * the Python source. */
        @Override
        public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
            CaseInsensitiveStringMap options = info.options();
            String exchange = Options.get(options, "exchange", null);
            if (exchange == null || !Writer.Plan.handles(info.schema())) {
                return ((SupportsWrite) python()).newWriteBuilder(info);
            }
            Options access = new Options(options, false);
            if (access.tls) return ((SupportsWrite) python()).newWriteBuilder(info);
            Writer.Plan plan = new Writer.Plan(
                    access,
                    exchange,
                    Options.flag(options, "mandatory", true),
                    Options.flag(options, "persistent", false),
                    info.schema());
            Write write = new Write() {
                @Override
                public String description() {
                    return "amqlite exchange " + exchange;
                }

                @Override
                public BatchWrite toBatch() {
                    return new Writer(plan);
                }

                @Override
                public StreamingWrite toStreaming() {
                    return ((SupportsWrite) python()).newWriteBuilder(info).build().toStreaming();
                }
            };
            return new WriteBuilder() {
                @Override
                public Write build() {
                    return write;
                }
            };
        }
    }

    static final class AmqliteScan implements Scan {
        private final AmqliteTable table;
        private final CaseInsensitiveStringMap options;
        private Scan pythonScan;

        AmqliteScan(AmqliteTable table, CaseInsensitiveStringMap options) {
            this.table = table;
            this.options = options;
        }

        private synchronized Scan pythonScan() {
            if (pythonScan == null) {
                pythonScan = ((SupportsRead) table.python()).newScanBuilder(options).build();
            }
            return pythonScan;
        }

        @Override
        public StructType readSchema() {
            return table.schema();
        }

        @Override
        public String description() {
            return "amqlite stream " + options.get("queue");
        }

        @Override
        public Batch toBatch() {
            Options o = new Options(options);
            if (!o.fetch || o.tls) return pythonScan().toBatch();
            return new FetchBatch(o);
        }

        @Override
        public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
            return pythonScan().toMicroBatchStream(checkpointLocation);
        }
    }
}
