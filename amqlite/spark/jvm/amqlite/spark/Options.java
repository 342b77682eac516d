package amqlite.spark;

import java.io.Serializable;
import java.util.Locale;
import java.util.Map;

/**
 * The read options, parsed on the driver as the Python source parses them
 * (amqlite/spark/source.py {@code read_options}), with the same error texts.
 */
final class Options implements Serializable {
    private static final long serialVersionUID = 1L;
    static final int FETCH_BYTES = 2 * 1024 * 1024;
    static final int FETCHES_IN_FLIGHT = 3;

    final String servers;
    final String vhost;
    final String login;
    final String password;
    final double connectTimeout;
    final boolean tls;
    final String queue;
    final String starting;
    final String ending;
    final int partitions;
    final int minPartitionSize;
    final double readTimeout;
    final boolean fetch;
    final int fetchBytes;
    final int fetchesInFlight;
    final boolean failOnDataLoss;

    Options(Map<String, String> options) {
        this(options, true);
    }

    /** With {@code read} false only the server access (a writer's options). */
    Options(Map<String, String> options, boolean read) {
        servers = get(options, "servers", null);
        if (servers == null || servers.isEmpty()) {
            throw new IllegalArgumentException(
                    "amqlite: option servers is required, e.g. .option('servers', 'host:5555,host:6666')");
        }
        vhost = orDefault(get(options, "vhost", "/"), "/");
        login = orDefault(get(options, "login", "guest"), "guest");
        password = orDefault(get(options, "password", "guest"), "guest");
        connectTimeout = number(options, "connectTimeout", "5", 0.1);
        tls = flag(options, "tls", false)
                || servers.toLowerCase(Locale.ROOT).contains("amqlites://")
                || !orDefault(get(options, "ca", ""), "").isEmpty();
        String q = read ? get(options, "queue", null) : "";
        if (q == null || (read && q.isEmpty())) {
            throw new IllegalArgumentException("amqlite: option queue (a stream queue to read) is required");
        }
        queue = q;
        starting = orDefault(get(options, "startingOffset", "first"), "first");
        ending = get(options, "endingOffset", null);
        if (read && get(options, "maxMessagesPerBatch", null) != null) number(options, "maxMessagesPerBatch", null, 1);
        partitions = (int) number(options, "partitions", "4", 1);
        minPartitionSize = (int) number(options, "minPartitionSize", "10000", 1);
        readTimeout = number(options, "readTimeout", "30", 0.1);
        fetch = flag(options, "fetch", true);
        fetchBytes = (int) number(options, "fetchBytes", String.valueOf(FETCH_BYTES), 1024);
        fetchesInFlight = (int) number(options, "fetchesInFlight", String.valueOf(FETCHES_IN_FLIGHT), 1);
        failOnDataLoss = flag(options, "failOnDataLoss", false);
    }

    private static String orDefault(String v, String d) {
        return v == null || v.isEmpty() ? d : v;
    }

    static String get(Map<String, String> options, String name, String d) {
        String v = options.get(name);
        if (v == null) v = options.get(name.toLowerCase(Locale.ROOT));
        return v == null ? d : v;
    }

    private static String repr(String text) {
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'";
    }

    private static String g(double low) {
        return low == Math.rint(low) ? String.valueOf((long) low) : String.valueOf(low);
    }

    private static double number(Map<String, String> options, String name, String d, double low) {
        String text = get(options, name, d);
        double value;
        try {
            value = Double.parseDouble(text.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(
                    "amqlite: option " + name + " must be a number, got " + repr(text));
        }
        if (value < low) {
            throw new IllegalArgumentException(
                    "amqlite: option " + name + " must be at least " + g(low) + ", got " + repr(text));
        }
        return value;
    }

    static boolean flag(Map<String, String> options, String name, boolean d) {
        String text = get(options, name, String.valueOf(d)).toLowerCase(Locale.ROOT);
        if (text.equals("true") || text.equals("1") || text.equals("yes")) return true;
        if (text.equals("false") || text.equals("0") || text.equals("no")) return false;
        throw new IllegalArgumentException(
                "amqlite: option " + name + " must be true or false, got " + repr(get(options, name, "")));
    }

    /** Offsets of the stream kept now: [first, next). */
    static long[] bounds(Options o) {
        try (Wire w = Wire.open(o, "amqlite-spark-plan")) {
            Map<String, Object> req = new java.util.LinkedHashMap<>();
            req.put("m", "status");
            Map<Object, Object> reply = w.call(req);
            Object info = reply.get("info");
            if (info instanceof Map<?, ?> status && status.get("vhosts") instanceof java.util.List<?> hosts) {
                for (Object h : hosts) {
                    if (!(h instanceof Map<?, ?> host) || !o.vhost.equals(host.get("name"))) continue;
                    if (!(host.get("queues") instanceof java.util.List<?> queues)) continue;
                    for (Object qq : queues) {
                        if (!(qq instanceof Map<?, ?> q) || !o.queue.equals(q.get("name"))) continue;
                        if (!"stream".equals(q.get("type"))) {
                            throw new IllegalArgumentException(
                                    "amqlite: queue " + repr(o.queue) + " in vhost " + repr(o.vhost) + " is a "
                                            + q.get("type") + " queue, not a stream: declare it with arguments "
                                            + "{\"x-queue-type\": \"stream\"} to read it from Spark");
                        }
                        return new long[] {
                            ((Number) q.get("first_offset")).longValue(), ((Number) q.get("next_offset")).longValue()
                        };
                    }
                }
            }
            throw new IllegalArgumentException(
                    "amqlite: no queue " + repr(o.queue) + " in vhost " + repr(o.vhost) + " on " + o.servers);
        } catch (java.io.IOException e) {
            throw new IllegalArgumentException(
                    "amqlite: cannot connect to servers " + repr(o.servers) + ": " + e.getMessage(), e);
        }
    }

    static long resolveStart(String spec, long first, long next) {
        String t = spec.trim().toLowerCase(Locale.ROOT);
        if (t.equals("first") || t.equals("earliest")) return first;
        if (t.equals("last")) return Math.max(first, next - 1);
        if (t.equals("next") || t.equals("latest")) return next;
        long n = parseOffset("startingOffset", spec);
        return Math.max(first, Math.min(n, next));
    }

    static long resolveEnd(String spec, long next) {
        if (spec == null) return next;
        String t = spec.trim().toLowerCase(Locale.ROOT);
        if (t.equals("latest") || t.equals("next") || t.equals("last")) return next;
        return Math.min(parseOffset("endingOffset", spec), next);
    }

    private static long parseOffset(String name, String spec) {
        long n;
        try {
            n = Long.parseLong(spec.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(
                    "amqlite: option " + name + " must be 'first', 'last', 'next' or an offset, got " + repr(spec));
        }
        if (n < 0) throw new IllegalArgumentException("amqlite: option " + name + " must not be negative, got " + n);
        return n;
    }
}
