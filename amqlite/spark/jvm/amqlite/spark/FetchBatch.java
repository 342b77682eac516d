package amqlite.spark;

import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A batch read of offsets [startingOffset, endingOffset) of a stream queue: the
 * range split as the Python reader splits it (cut on multiples of the broker's
 * 8,192-offset fetch blocks when the parts hold at least one), each part read by
 * one task with a few {@code stream.fetch} requests in flight, each
 * {@code stream.records} reply becoming one ColumnarBatch.
 */
final class FetchBatch implements Batch {
    static final long BLOCK = 8192;
    private final Options o;
    private InputPartition[] planned;

    FetchBatch(Options o) {
        this.o = o;
    }

    static final class Range implements InputPartition {
        private static final long serialVersionUID = 1L;
        final long start;
        final long end;

        Range(long start, long end) {
            this.start = start;
            this.end = end;
        }
    }

    /** As bridge.split_range, with the cuts moved to block boundaries for big parts. */
    static List<long[]> split(long start, long end, int parts, int minSize) {
        List<long[]> out = new ArrayList<>();
        long total = end - start;
        if (total <= 0) return out;
        long n = Math.max(1, Math.min(parts, total / Math.max(1, minSize)));
        long step = total / n;
        long extra = total % n;
        long at = start;
        for (long i = 0; i < n; i++) {
            long hi = at + step + (i < extra ? 1 : 0);
            long cut = hi;
            if (step >= BLOCK && i < n - 1) cut = Math.round((double) hi / BLOCK) * BLOCK;
            cut = Math.max(at, Math.min(end, cut));
            if (cut > at) out.add(new long[] {at, cut});
            at = cut;
        }
        if (at < end) {
            if (out.isEmpty()) out.add(new long[] {at, end});
            else out.get(out.size() - 1)[1] = end;
        }
        return out;
    }

    @Override
    public synchronized InputPartition[] planInputPartitions() {
        if (planned == null) {
            long[] b = Options.bounds(o);
            long start = Options.resolveStart(o.starting, b[0], b[1]);
            long end = Math.max(start, Options.resolveEnd(o.ending, b[1]));
            List<InputPartition> parts = new ArrayList<>();
            for (long[] r : split(start, end, o.partitions, o.minPartitionSize)) parts.add(new Range(r[0], r[1]));
            if (parts.isEmpty()) parts.add(new Range(start, start));
            planned = parts.toArray(new InputPartition[0]);
        }
        return planned;
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new Factory(o);
    }

    static final class Factory implements PartitionReaderFactory, Serializable {
        private static final long serialVersionUID = 1L;
        private final Options o;

        Factory(Options o) {
            this.o = o;
        }

        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return true;
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            throw new UnsupportedOperationException("amqlite: the JVM reader is columnar");
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            Range r = (Range) partition;
            return new Reader(o, r.start, r.end);
        }
    }

    /** The fetches of one task and the column vectors they fill. */
    static final class Reader implements PartitionReader<ColumnarBatch> {
        private static final double RETRY_FIRST = 0.005;
        private static final double RETRY_MAX = 0.2;

        private static final class Request {
            long id;
            long lo;
            final long hi;
            double waited;
            double pause = RETRY_FIRST;

            Request(long lo, long hi) {
                this.lo = lo;
                this.hi = hi;
            }
        }

        private final Options o;
        private final long end;
        private final int budget;
        private long at;
        private Wire wire;
        private final ArrayDeque<Request> pending = new ArrayDeque<>();
        private long seenBytes;
        private long seenRecords;
        private OnHeapColumnVector[] columns;
        private ColumnarBatch batch;
        private int capacity;

        Reader(Options o, long start, long end) {
            this.o = o;
            this.at = start;
            this.end = end;
            this.budget = Math.max(1, Math.min(o.fetchBytes, Wire.MAX_FRAME - 1024));
        }

        private long span() {
            if (seenRecords == 0) return Math.max(1, o.fetchBytes / 256);
            long per = Math.max(1, seenBytes / seenRecords);
            return Math.max(1, o.fetchBytes / per);
        }

        private void send(Request r) throws IOException {
            r.id = wire.newId();
            Map<String, Object> req = new LinkedHashMap<>();
            req.put("m", "stream.fetch");
            req.put("id", r.id);
            req.put("queue", o.queue);
            req.put("start", r.lo);
            req.put("end", r.hi);
            req.put("max_bytes", (long) budget);
            wire.send(req);
        }

        private void fill() throws IOException {
            while (at < end && pending.size() < Math.max(1, o.fetchesInFlight)) {
                long hi = Math.min(end, ((at + span() + BLOCK - 1) / BLOCK) * BLOCK);
                Request r = new Request(at, hi);
                send(r);
                pending.addLast(r);
                at = hi;
            }
        }

        /** A new connection (the other server of an HA pair after a failover), the
         * requests in flight sent again on it. */
        private void reconnect(IOException cause) throws IOException {
            if (wire != null) wire.close();
            wire = null;
            long deadline = System.nanoTime() + (long) (Math.max(o.readTimeout, o.connectTimeout) * 1e9);
            long pause = 50;
            while (true) {
                try {
                    wire = Wire.open(o, "amqlite-spark-fetch");
                    break;
                } catch (Wire.Refusal refusal) {
                    if (refusal.code != Wire.NOT_ACTIVE) throw refusal;
                    if (System.nanoTime() > deadline) throw refusal;
                } catch (IOException e) {
                    if (System.nanoTime() > deadline) {
                        if (cause != null) e.addSuppressed(cause);
                        throw e;
                    }
                }
                sleep(pause / 1000.0);
                pause = Math.min(pause * 2, 1000);
            }
            for (Request r : pending) send(r);
        }

        private static void sleep(double seconds) {
            try {
                Thread.sleep((long) (seconds * 1000));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException("amqlite: read interrupted", e);
            }
        }

        @Override
        public boolean next() throws IOException {
            while (true) {
                if (wire == null) reconnect(null);
                Map<Object, Object> reply;
                try {
                    fill();
                    if (pending.isEmpty()) return false;
                    wire.keepAlive();
                    reply = wire.reply(pending.peekFirst().id);
                } catch (Wire.Refusal refusal) {
                    throw new IllegalStateException(
                            "amqlite: stream.fetch of stream '" + o.queue + "' refused: " + refusal.getMessage(),
                            refusal);
                } catch (IOException lost) {
                    reconnect(lost);
                    continue;
                }
                Request r = pending.pollFirst();
                long first = ((Number) reply.get("first")).longValue();
                int count = ((Number) reply.get("count")).intValue();
                Object d = reply.get("dropped");
                long dropped = d instanceof Number n ? n.longValue() : 0;
                if (dropped > 0 && o.failOnDataLoss) {
                    throw new IllegalStateException("amqlite: offsets " + r.lo + " to " + (r.lo + dropped - 1)
                            + " of stream '" + o.queue + "' were removed by retention before they were read"
                            + " (failOnDataLoss is true)");
                }
                if (count > 0) {
                    r.lo = first + count;
                    if (r.lo < r.hi) {
                        r.waited = 0;
                        r.pause = RETRY_FIRST;
                        again(r);
                    }
                    build(reply, first, count);
                    return true;
                }
                if (first >= r.hi) continue; // the rest was removed by retention
                if (r.waited >= o.readTimeout) {
                    throw new IllegalStateException("amqlite: stream '" + o.queue + "' gave nothing for "
                            + o.readTimeout + "s while offsets from " + r.lo + " to " + (r.hi - 1)
                            + " were expected");
                }
                sleep(r.pause); // not readable yet: an HA passive catching up
                r.waited += r.pause;
                r.lo = Math.max(r.lo, first);
                r.pause = Math.min(r.pause * 2, RETRY_MAX);
                again(r);
            }
        }

        /** The rest of {@code r}'s range asked for again, ahead of the fetches in flight. */
        private void again(Request r) throws IOException {
            pending.addFirst(r);
            try {
                send(r);
            } catch (IOException lost) {
                reconnect(lost); // sends every pending request again, r first
            }
        }

        private static int end(byte[] ends, int i) {
            int p = 4 * i;
            return (ends[p] & 0xFF) | (ends[p + 1] & 0xFF) << 8 | (ends[p + 2] & 0xFF) << 16 | (ends[p + 3] & 0xFF) << 24;
        }

        /** Binary or string column {@code c} from a reply's values and *_ends: one copy of
         * the values, then each row's position. */
        private static void binary(WritableColumnVector c, int n, byte[] values, byte[] ends) {
            WritableColumnVector data = c.arrayData();
            int base = data.getElementsAppended();
            int total = end(ends, n);
            if (total > 0) data.appendBytes(total, values, 0);
            int lo = end(ends, 0);
            for (int i = 0; i < n; i++) {
                int hi = end(ends, i + 1);
                c.putArray(i, base + lo, hi - lo);
                lo = hi;
            }
        }

        private void build(Map<Object, Object> reply, long first, int n) {
            if (columns == null || n > capacity) {
                if (batch != null) batch.close();
                capacity = Math.max(n, 8192);
                columns = OnHeapColumnVector.allocateColumns(capacity, AmqliteProvider.READ_SCHEMA);
                batch = new ColumnarBatch(columns);
            } else {
                for (OnHeapColumnVector c : columns) c.reset();
            }
            byte[] keys = (byte[]) reply.get("keys");
            byte[] bodies = (byte[]) reply.get("bodies");
            byte[] exchanges = (byte[]) reply.get("exchanges");
            seenBytes += keys.length + bodies.length + 16L * n;
            seenRecords += n;
            OnHeapColumnVector offset = columns[0];
            for (int i = 0; i < n; i++) offset.putLong(i, first + i);
            binary(columns[1], n, exchanges, (byte[]) reply.get("exchange_ends"));
            binary(columns[2], n, keys, (byte[]) reply.get("key_ends"));
            binary(columns[4], n, bodies, (byte[]) reply.get("body_ends"));
            OnHeapColumnVector headers = columns[3];
            OnHeapColumnVector when = columns[5];
            when.putNulls(0, n);
            for (int c = 6; c < 9; c++) columns[c].putNulls(0, n);
            Object extras = reply.get("extras");
            WritableColumnVector hKeys = headers.getChild(0);
            WritableColumnVector hValues = headers.getChild(1);
            int row = 0;
            if (extras instanceof List<?> list) {
                for (Object e : list) {
                    List<?> x = (List<?>) e;
                    int i = ((Number) x.get(0)).intValue();
                    for (; row < i; row++) headers.putArray(row, hKeys.getElementsAppended(), 0);
                    int startAt = hKeys.getElementsAppended();
                    int size = 0;
                    if (x.get(1) instanceof Map<?, ?> h) {
                        for (Map.Entry<?, ?> kv : h.entrySet()) {
                            byte[] k = String.valueOf(kv.getKey()).getBytes(java.nio.charset.StandardCharsets.UTF_8);
                            hKeys.appendByteArray(k, 0, k.length);
                            String v = Values.text(kv.getValue());
                            if (v == null) {
                                hValues.appendNull();
                            } else {
                                byte[] vb = v.getBytes(java.nio.charset.StandardCharsets.UTF_8);
                                hValues.appendByteArray(vb, 0, vb.length);
                            }
                            size++;
                        }
                    }
                    headers.putArray(i, startAt, size);
                    row = i + 1;
                    if (x.size() > 2 && x.get(2) instanceof Map<?, ?> props) {
                        Long micros = Values.micros(props.get("timestamp"));
                        if (micros != null) {
                            when.putNotNull(i);
                            when.putLong(i, micros);
                        }
                        text(columns[6], i, props.get("message_id"));
                        text(columns[7], i, props.get("correlation_id"));
                        text(columns[8], i, props.get("content_type"));
                    }
                }
            }
            int tail = hKeys.getElementsAppended();
            for (; row < n; row++) headers.putArray(row, tail, 0);
            batch.setNumRows(n);
        }

        private static void text(OnHeapColumnVector c, int i, Object v) {
            String s = Values.text(v);
            if (s == null) return;
            byte[] raw = s.getBytes(java.nio.charset.StandardCharsets.UTF_8);
            c.putNotNull(i);
            c.putByteArray(i, raw, 0, raw.length);
        }

        @Override
        public ColumnarBatch get() {
            return batch;
        }

        @Override
        public void close() {
            if (wire != null) wire.close();
            wire = null;
            if (batch != null) batch.close();
            batch = null;
        }
    }
}
