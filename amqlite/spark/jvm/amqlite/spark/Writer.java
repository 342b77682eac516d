package amqlite.spark;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A batch write of rows to an exchange from the JVM: each task sends its rows as
 * {@code publish.columns} frames (keys and bodies end to end, their ends as
 * little-endian u32, headers and message ids in {@code extras}), a few in flight,
 * and fails on the first refused message (a nack, an unroutable row when
 * {@code mandatory}) or error; it returns only when every row is confirmed. A
 * failed task that Spark runs again publishes its rows again: at least once. The
 * messages are those the Python writer sends for the same rows
 * (amqlite/spark/arrow.py {@code wire_messages}).
 */
final class Writer implements BatchWrite {
    static final int FRAME_BYTES = 512 * 1024;
    static final int FRAME_MESSAGES = 16384;
    static final int IN_FLIGHT = 4;

    /** The write options (source.py {@code write_options}) and the columns' places. */
    static final class Plan implements Serializable {
        private static final long serialVersionUID = 1L;
        final Options access;
        final String exchange;
        final boolean mandatory;
        final boolean persistent;
        final int key;
        final int body;
        final boolean bodyText;
        final int headers;
        final int messageId;

        Plan(Options access, String exchange, boolean mandatory, boolean persistent, StructType schema) {
            this.access = access;
            this.exchange = exchange;
            this.mandatory = mandatory;
            this.persistent = persistent;
            this.key = index(schema, "routing_key");
            this.body = index(schema, "body");
            this.bodyText = schema.fields()[body].dataType() instanceof StringType;
            this.headers = index(schema, "headers");
            this.messageId = index(schema, "message_id");
        }

        private static int index(StructType schema, String name) {
            String[] names = schema.fieldNames();
            for (int i = 0; i < names.length; i++) if (names[i].equals(name)) return i;
            return -1;
        }

        /** Whether the JVM writer takes these columns as the Python writer does (else
         * the Python writer runs): routing_key and message_id strings, body binary or
         * string, headers a map of strings, nothing else. */
        static boolean handles(StructType schema) {
            boolean body = false;
            for (var f : schema.fields()) {
                DataType t = f.dataType();
                switch (f.name()) {
                    case "body":
                        body = t instanceof BinaryType || t instanceof StringType;
                        if (!body) return false;
                        break;
                    case "routing_key":
                    case "message_id":
                        if (!(t instanceof StringType)) return false;
                        break;
                    case "headers":
                        if (!(t instanceof MapType m)
                                || !(m.keyType() instanceof StringType)
                                || !(m.valueType() instanceof StringType)) return false;
                        break;
                    default:
                        return false;
                }
            }
            return body;
        }
    }

    private final Plan plan;

    Writer(Plan plan) {
        this.plan = plan;
    }

    @Override
    public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
        return new Factory(plan);
    }

    @Override
    public void commit(WriterCommitMessage[] messages) {
        // every row was confirmed before its task finished
    }

    @Override
    public void abort(WriterCommitMessage[] messages) {
        // published rows cannot be taken back; a failed job runs again (at least once)
    }

    static final class Published implements WriterCommitMessage {
        private static final long serialVersionUID = 1L;
        final long count;

        Published(long count) {
            this.count = count;
        }
    }

    static final class Factory implements DataWriterFactory {
        private static final long serialVersionUID = 1L;
        private final Plan plan;

        Factory(Plan plan) {
            this.plan = plan;
        }

        @Override
        public DataWriter<InternalRow> createWriter(int partitionId, long taskId) {
            return new Task(plan);
        }
    }

    static final class Task implements DataWriter<InternalRow> {
        private final Plan plan;
        private Wire wire;
        private final ByteArrayOutputStream keys = new ByteArrayOutputStream(1 << 16);
        private final ByteArrayOutputStream bodies = new ByteArrayOutputStream(1 << 19);
        private final ByteArrayOutputStream keyEnds = new ByteArrayOutputStream(1 << 14);
        private final ByteArrayOutputStream bodyEnds = new ByteArrayOutputStream(1 << 14);
        private final List<Object> extras = new ArrayList<>();
        private int count;
        private long sent;
        /** A frame sent and not yet confirmed: sent again on a new connection. */
        private static final class Frame {
            final Map<String, Object> request;
            final long base;
            final int count;
            long id;

            Frame(Map<String, Object> request, long base, int count) {
                this.request = request;
                this.base = base;
                this.count = count;
            }
        }

        private final ArrayDeque<Frame> pending = new ArrayDeque<>();

        Task(Plan plan) {
            this.plan = plan;
            startFrame();
        }

        private static void u32(ByteArrayOutputStream out, int v) {
            out.write(v);
            out.write(v >>> 8);
            out.write(v >>> 16);
            out.write(v >>> 24);
        }

        private void startFrame() {
            keys.reset();
            bodies.reset();
            keyEnds.reset();
            bodyEnds.reset();
            extras.clear();
            count = 0;
            u32(keyEnds, 0);
            u32(bodyEnds, 0);
        }

        @Override
        public void write(InternalRow row) throws IOException {
            if (plan.key >= 0 && !row.isNullAt(plan.key)) row.getUTF8String(plan.key).writeTo(keys);
            if (!row.isNullAt(plan.body)) {
                if (plan.bodyText) row.getUTF8String(plan.body).writeTo(bodies);
                else bodies.write(row.getBinary(plan.body));
            }
            u32(keyEnds, keys.size());
            u32(bodyEnds, bodies.size());
            Map<String, Object> headers = null;
            if (plan.headers >= 0 && !row.isNullAt(plan.headers)) {
                MapData m = row.getMap(plan.headers);
                if (m.numElements() > 0) {
                    headers = new LinkedHashMap<>();
                    ArrayData k = m.keyArray();
                    ArrayData v = m.valueArray();
                    for (int i = 0; i < m.numElements(); i++) {
                        headers.put(k.getUTF8String(i).toString(), v.isNullAt(i) ? null : v.getUTF8String(i).toString());
                    }
                }
            }
            String id = null;
            if (plan.messageId >= 0 && !row.isNullAt(plan.messageId)) id = row.getUTF8String(plan.messageId).toString();
            if (headers != null || id != null) {
                Map<String, Object> props = id == null || id.isEmpty() ? null : Map.of("message_id", id);
                List<Object> extra = new ArrayList<>(3);
                extra.add((long) count);
                extra.add(headers);
                extra.add(props);
                extras.add(extra);
            }
            count++;
            if (count >= FRAME_MESSAGES || keys.size() + bodies.size() + 8L * count >= FRAME_BYTES) flush();
        }

        private void flush() throws IOException {
            if (count == 0) return;
            if (wire == null) reconnect(null);
            while (pending.size() >= IN_FLIGHT) settleFirst();
            Map<String, Object> req = new LinkedHashMap<>();
            req.put("m", "publish.columns");
            req.put("id", 0L);
            req.put("exchange", plan.exchange);
            req.put("count", (long) count);
            req.put("keys", keys.toByteArray());
            req.put("key_ends", keyEnds.toByteArray());
            req.put("bodies", bodies.toByteArray());
            req.put("body_ends", bodyEnds.toByteArray());
            if (!extras.isEmpty()) req.put("extras", new ArrayList<>(extras));
            if (plan.mandatory) req.put("mandatory", true);
            if (plan.persistent) req.put("persistent", true);
            Frame f = new Frame(req, sent, count);
            pending.addLast(f);
            sent += count;
            startFrame();
            try {
                send(f);
            } catch (IOException lost) {
                reconnect(lost);
            }
        }

        private void send(Frame f) throws IOException {
            f.id = wire.newIds(f.count);
            f.request.put("id", f.id);
            wire.send(f.request);
        }

        /** A new connection (the other server of an HA pair after a failover), every
         * frame not yet confirmed sent again on it (at least once). */
        private void reconnect(IOException cause) throws IOException {
            if (wire != null) wire.close();
            wire = null;
            long deadline = System.nanoTime()
                    + (long) (Math.max(plan.access.readTimeout, plan.access.connectTimeout) * 1e9);
            long pause = 50;
            while (true) {
                try {
                    wire = Wire.open(plan.access, "amqlite-spark-write");
                    for (Frame f : pending) send(f);
                    return;
                } catch (Wire.Refusal refusal) {
                    if (refusal.code != Wire.NOT_ACTIVE || System.nanoTime() > deadline) throw refusal;
                } catch (IOException e) {
                    if (System.nanoTime() > deadline) {
                        if (cause != null) e.addSuppressed(cause);
                        throw new IllegalStateException("amqlite: cannot connect to servers '"
                                + plan.access.servers + "': " + e.getMessage(), e);
                    }
                }
                if (wire != null) wire.close();
                wire = null;
                try {
                    Thread.sleep(pause);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new IOException("amqlite: write interrupted", e);
                }
                pause = Math.min(pause * 2, 1000);
            }
        }

        private void settleFirst() throws IOException {
            while (true) {
                Frame f = pending.peekFirst();
                try {
                    settle(f);
                    pending.pollFirst();
                    return;
                } catch (Wire.Refusal r) {
                    throw r;
                } catch (IOException lost) {
                    reconnect(lost);
                }
            }
        }

        private void settle(Frame p) throws IOException {
            Map<Object, Object> reply;
            try {
                reply = wire.reply(p.id);
            } catch (Wire.Refusal r) {
                if (r.code == 404 || r.code == 406) {
                    throw new IllegalStateException(
                            "amqlite: cannot publish to exchange '" + plan.exchange + "': " + r.getMessage(), r);
                }
                throw new IllegalStateException("amqlite: publish refused: " + r.getMessage(), r);
            }
            Object info = reply.get("info");
            if (!(info instanceof Map<?, ?> ok) || !(ok.get("count") instanceof Number)) {
                throw new IOException("publish.columns: unexpected reply " + reply.get("m"));
            }
            if (ok.get("refused") instanceof List<?> refused && !refused.isEmpty()) {
                List<?> first = (List<?>) refused.get(0);
                long i = ((Number) first.get(0)).longValue() + p.base;
                int code = ((Number) first.get(1)).intValue();
                throw new IllegalStateException(String.format(Locale.ROOT,
                        "amqlite: message %d of this task was %s: %d %s: %s", i,
                        first.size() > 3 ? first.get(3) : "refused", code, Wire.Refusal.name(code), first.get(2)));
            }
        }

        @Override
        public WriterCommitMessage commit() throws IOException {
            flush();
            while (!pending.isEmpty()) settleFirst();
            return new Published(sent);
        }

        @Override
        public void abort() {
            close();
        }

        @Override
        public void close() {
            if (wire != null) wire.close();
            wire = null;
        }
    }
}
