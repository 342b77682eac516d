package amqlite.spark;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * One native-protocol connection (docs/protocol.md): 4-byte big-endian length, then
 * one CBOR map. {@link #open} dials the servers of the list in order and takes the
 * first that says {@code welcome}; one that refuses with 360 NOT_ACTIVE (an HA
 * passive) or cannot be reached is skipped. Requests may be pipelined: replies are
 * matched by {@code re}.
 */
final class Wire implements AutoCloseable {
    static final int NOT_ACTIVE = 360;
    static final int MAX_FRAME = 4 * 1024 * 1024;

    /** A broker's {@code error} or {@code refused} reply. */
    static final class Refusal extends IOException {
        final int code;

        Refusal(int code, String text) {
            super(code + " " + name(code) + ": " + text);
            this.code = code;
        }

        /** The reply code's name (amqlite/errors.py ReplyCode). */
        static String name(int code) {
            switch (code) {
                case 311: return "CONTENT_TOO_LARGE";
                case 312: return "NO_ROUTE";
                case 313: return "NO_CONSUMERS";
                case 320: return "CONNECTION_FORCED";
                case 360: return "NOT_ACTIVE";
                case 403: return "ACCESS_REFUSED";
                case 404: return "NOT_FOUND";
                case 405: return "RESOURCE_LOCKED";
                case 406: return "PRECONDITION_FAILED";
                case 501: return "FRAME_ERROR";
                case 502: return "SYNTAX_ERROR";
                case 506: return "RESOURCE_ERROR";
                case 530: return "NOT_ALLOWED";
                case 540: return "NOT_IMPLEMENTED";
                case 541: return "INTERNAL_ERROR";
                default: return "ERROR";
            }
        }
    }

    private final Socket socket;
    private final DataInputStream in;
    private final DataOutputStream out;
    private final Map<Long, Map<Object, Object>> early = new HashMap<>();
    private long nextId = 1;
    private final long heartbeatNanos;
    private long lastSent = System.nanoTime();
    final int maxFrame;

    private Wire(Socket socket, Options o, String client) throws IOException {
        this.socket = socket;
        this.in = new DataInputStream(new BufferedInputStream(socket.getInputStream(), 1 << 16));
        this.out = new DataOutputStream(new BufferedOutputStream(socket.getOutputStream(), 1 << 14));
        Map<String, Object> hello = new LinkedHashMap<>();
        hello.put("m", "hello");
        hello.put("id", 0L);
        hello.put("vhost", o.vhost);
        hello.put("login", o.login);
        hello.put("password", o.password);
        hello.put("client", client);
        send(hello);
        Map<Object, Object> reply = frame();
        Object m = reply.get("m");
        if ("refused".equals(m)) {
            throw new Refusal(((Number) reply.get("code")).intValue(), String.valueOf(reply.get("text")));
        }
        if (!"welcome".equals(m)) throw new IOException("expected welcome, got " + m);
        Object hb = reply.get("heartbeat");
        double seconds = hb instanceof Number n ? n.doubleValue() : 0.0;
        heartbeatNanos = (long) (seconds * 1e9);
        Object mf = reply.get("max_frame");
        long server = mf instanceof Number n ? n.longValue() : 0;
        maxFrame = server > 0 ? (int) Math.min(server, MAX_FRAME) : MAX_FRAME;
    }

    /** {@code [host, port]} entries of a {@code servers} option ("host:port,host:port"). */
    static List<String[]> addresses(String servers) {
        List<String[]> out = new ArrayList<>();
        for (String part : servers.split(",")) {
            String item = part.trim();
            if (item.toLowerCase().startsWith("amqlite://")) item = item.substring(10);
            while (item.endsWith("/")) item = item.substring(0, item.length() - 1);
            if (item.isEmpty()) continue;
            String host;
            String port = "";
            if (item.startsWith("[")) {
                int close = item.indexOf(']');
                host = item.substring(1, close);
                if (close + 1 < item.length()) port = item.substring(close + 2);
            } else if (item.indexOf(':') >= 0) {
                host = item.substring(0, item.indexOf(':'));
                port = item.substring(item.indexOf(':') + 1);
            } else {
                host = item;
            }
            out.add(new String[] {host, port.isEmpty() ? "5555" : port});
        }
        return out;
    }

    /** The first server of the list that welcomes this reader ({@code client}: the
     * connection's name in the broker's status and logs, as the Python reader names it). */
    static Wire open(Options o, String client) throws IOException {
        IOException last = null;
        for (String[] a : addresses(o.servers)) {
            Socket s = new Socket();
            try {
                int timeout = (int) Math.max(100, o.connectTimeout * 1000);
                s.connect(new InetSocketAddress(a[0], Integer.parseInt(a[1])), timeout);
                s.setTcpNoDelay(true);
                s.setSoTimeout(timeout);
                Wire w = new Wire(s, o, client);
                s.setSoTimeout((int) Math.max(1000, o.readTimeout * 1000));
                return w;
            } catch (Refusal r) {
                closeQuietly(s);
                if (r.code != NOT_ACTIVE) throw r;
                last = r;
            } catch (IOException e) {
                closeQuietly(s);
                last = e;
            }
        }
        throw new IOException(
                "cannot connect to servers '" + o.servers + "': "
                        + (last == null ? "no server" : last.getMessage()),
                last);
    }

    private static void closeQuietly(Socket s) {
        try {
            s.close();
        } catch (IOException ignored) {
            // nothing to do
        }
    }

    long newId() {
        return nextId++;
    }

    /** The first of {@code n} consecutive ids (a publish.columns of n messages). */
    long newIds(int n) {
        long first = nextId;
        nextId += n;
        return first;
    }

    void send(Map<String, ?> map) throws IOException {
        byte[] payload = Cbor.encode(map);
        out.writeInt(payload.length);
        out.write(payload);
        out.flush();
        lastSent = System.nanoTime();
    }

    /** A heartbeat when this side has sent nothing for half the agreed interval. */
    void keepAlive() throws IOException {
        if (heartbeatNanos > 0 && System.nanoTime() - lastSent > heartbeatNanos / 2) {
            send(Map.of("m", "heartbeat"));
        }
    }

    @SuppressWarnings("unchecked")
    private Map<Object, Object> frame() throws IOException {
        int length = in.readInt();
        if (length < 0 || length > MAX_FRAME + 65536) throw new IOException("frame too large: " + length);
        byte[] payload = new byte[length];
        in.readFully(payload);
        Object item = Cbor.decode(payload);
        if (!(item instanceof Map)) throw new IOException("a frame that is not a map");
        return (Map<Object, Object>) item;
    }

    /** The reply to request {@code id}; an {@code error} reply raises a Refusal. */
    Map<Object, Object> reply(long id) throws IOException {
        Map<Object, Object> r = early.remove(id);
        while (r == null) {
            Map<Object, Object> f = frame();
            Object m = f.get("m");
            if ("close".equals(m)) {
                throw new IOException("the server closed the connection: " + f.get("code") + " " + f.get("text"));
            }
            Object re = f.get("re");
            if (!(re instanceof Long key)) continue; // heartbeat, pushes
            if (key == id) r = f;
            else early.put(key, f);
        }
        if ("error".equals(r.get("m"))) {
            throw new Refusal(((Number) r.get("code")).intValue(), String.valueOf(r.get("text")));
        }
        return r;
    }

    Map<Object, Object> call(Map<String, Object> request) throws IOException {
        long id = newId();
        request.put("id", id);
        send(request);
        return reply(id);
    }

    @Override
    public void close() {
        try {
            Map<String, Object> bye = new LinkedHashMap<>();
            bye.put("m", "close");
            bye.put("code", 200L);
            bye.put("text", "");
            send(bye);
        } catch (IOException ignored) {
            // the socket goes anyway
        }
        closeQuietly(socket);
    }
}
