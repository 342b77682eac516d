package amqlite.spark;

import java.io.ByteArrayOutputStream;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The few CBOR items (RFC 8949) the native protocol's frames use: an encoder for the
 * request maps this reader sends and a decoder for any reply. Decoded values are
 * Long or BigInteger, Double, Boolean, null, String, byte[], List and Map (insertion
 * ordered, as the sender wrote it).
 */
final class Cbor {
    private Cbor() {}

    // --- encoding ---------------------------------------------------------------------

    static byte[] encode(Map<String, ?> map) {
        ByteArrayOutputStream out = new ByteArrayOutputStream(128);
        write(out, map);
        return out.toByteArray();
    }

    private static void head(ByteArrayOutputStream out, int major, long n) {
        int m = major << 5;
        if (n < 24) {
            out.write(m | (int) n);
        } else if (n < 0x100) {
            out.write(m | 24);
            out.write((int) n);
        } else if (n < 0x10000) {
            out.write(m | 25);
            out.write((int) (n >>> 8));
            out.write((int) n);
        } else if (n < 0x100000000L) {
            out.write(m | 26);
            for (int s = 24; s >= 0; s -= 8) out.write((int) (n >>> s));
        } else {
            out.write(m | 27);
            for (int s = 56; s >= 0; s -= 8) out.write((int) (n >>> s));
        }
    }

    @SuppressWarnings("unchecked")
    private static void write(ByteArrayOutputStream out, Object v) {
        if (v == null) {
            out.write(0xF6);
        } else if (v instanceof Boolean b) {
            out.write(b ? 0xF5 : 0xF4);
        } else if (v instanceof Integer || v instanceof Long) {
            long n = ((Number) v).longValue();
            if (n >= 0) head(out, 0, n);
            else head(out, 1, -1 - n);
        } else if (v instanceof Double d) {
            out.write(0xFB);
            long bits = Double.doubleToLongBits(d);
            for (int s = 56; s >= 0; s -= 8) out.write((int) (bits >>> s));
        } else if (v instanceof String s) {
            byte[] raw = s.getBytes(StandardCharsets.UTF_8);
            head(out, 3, raw.length);
            out.write(raw, 0, raw.length);
        } else if (v instanceof byte[] raw) {
            head(out, 2, raw.length);
            out.write(raw, 0, raw.length);
        } else if (v instanceof List<?> list) {
            head(out, 4, list.size());
            for (Object item : list) write(out, item);
        } else if (v instanceof Map<?, ?> map) {
            head(out, 5, map.size());
            for (Map.Entry<?, ?> e : map.entrySet()) {
                write(out, e.getKey());
                write(out, e.getValue());
            }
        } else {
            throw new IllegalArgumentException("cannot encode " + v.getClass());
        }
    }

    // --- decoding ---------------------------------------------------------------------

    /** Decodes one item from {@code data}. */
    static Object decode(byte[] data) {
        return new Decoder(data).item();
    }

    private static final Object BREAK = new Object();

    private static final class Decoder {
        private final byte[] d;
        private int at;

        Decoder(byte[] data) {
            d = data;
        }

        private int u8() {
            if (at >= d.length) throw new IllegalStateException("truncated CBOR");
            return d[at++] & 0xFF;
        }

        private long argument(int info) {
            if (info < 24) return info;
            switch (info) {
                case 24:
                    return u8();
                case 25:
                    return ((long) u8() << 8) | u8();
                case 26: {
                    long n = 0;
                    for (int i = 0; i < 4; i++) n = (n << 8) | u8();
                    return n;
                }
                case 27: {
                    long n = 0;
                    for (int i = 0; i < 8; i++) n = (n << 8) | u8();
                    return n; // may be "negative": an unsigned 64-bit value
                }
                default:
                    throw new IllegalStateException("bad CBOR length " + info);
            }
        }

        private byte[] raw(int length) {
            if (length < 0 || at + length > d.length) throw new IllegalStateException("truncated CBOR");
            byte[] out = new byte[length];
            System.arraycopy(d, at, out, 0, length);
            at += length;
            return out;
        }

        private byte[] chunks(int major, int info) {
            if (info != 31) return raw(Math.toIntExact(argument(info)));
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            while (true) {
                int ib = u8();
                if (ib == 0xFF) return out.toByteArray();
                if (ib >> 5 != major) throw new IllegalStateException("bad CBOR chunk");
                byte[] part = raw(Math.toIntExact(argument(ib & 31)));
                out.write(part, 0, part.length);
            }
        }

        Object item() {
            int ib = u8();
            int major = ib >> 5;
            int info = ib & 31;
            switch (major) {
                case 0: {
                    long n = argument(info);
                    return n >= 0 ? (Object) n : new BigInteger(Long.toUnsignedString(n));
                }
                case 1: {
                    long n = argument(info);
                    if (n >= 0) return -1 - n;
                    return new BigInteger(Long.toUnsignedString(n)).add(BigInteger.ONE).negate();
                }
                case 2:
                    return chunks(2, info);
                case 3:
                    return new String(chunks(3, info), StandardCharsets.UTF_8);
                case 4: {
                    List<Object> list = new ArrayList<>();
                    if (info == 31) {
                        for (Object x = item(); x != BREAK; x = item()) list.add(x);
                    } else {
                        long n = argument(info);
                        for (long i = 0; i < n; i++) list.add(item());
                    }
                    return list;
                }
                case 5: {
                    Map<Object, Object> map = new LinkedHashMap<>();
                    if (info == 31) {
                        for (Object k = item(); k != BREAK; k = item()) map.put(k, item());
                    } else {
                        long n = argument(info);
                        for (long i = 0; i < n; i++) {
                            Object k = item();
                            map.put(k, item());
                        }
                    }
                    return map;
                }
                case 6: {
                    long tag = argument(info);
                    Object inner = item();
                    if ((tag == 2 || tag == 3) && inner instanceof byte[] mag) {
                        BigInteger big = new BigInteger(1, mag);
                        return tag == 2 ? big : big.add(BigInteger.ONE).negate();
                    }
                    return inner;
                }
                default:
                    switch (info) {
                        case 20:
                            return Boolean.FALSE;
                        case 21:
                            return Boolean.TRUE;
                        case 22:
                        case 23:
                            return null;
                        case 25:
                            return half((int) argument(25));
                        case 26:
                            return (double) Float.intBitsToFloat((int) argument(26));
                        case 27:
                            return Double.longBitsToDouble(argument(27));
                        case 31:
                            return BREAK;
                        default:
                            if (info < 24) return null; // an unassigned simple value
                            argument(info);
                            return null;
                    }
            }
        }

        private static double half(int bits) {
            int exp = (bits >> 10) & 0x1F;
            int mant = bits & 0x3FF;
            double v;
            if (exp == 0) v = Math.scalb((double) mant, -24);
            else if (exp != 31) v = Math.scalb((double) (mant + 1024), exp - 25);
            else v = mant == 0 ? Double.POSITIVE_INFINITY : Double.NaN;
            return (bits & 0x8000) != 0 ? -v : v;
        }
    }
}
