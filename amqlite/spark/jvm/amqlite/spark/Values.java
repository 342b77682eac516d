package amqlite.spark;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.Locale;

/**
 * Column values as the Python reader makes them (amqlite/spark/bridge.py
 * {@code _text} and {@code _when}): a header value is Python's {@code str()} of it,
 * a timestamp property (integer seconds) the instant in microseconds.
 */
final class Values {
    private Values() {}

    /** Python's {@code str(value)} for a header value (a CBOR scalar); null for null. */
    static String text(Object v) {
        if (v == null) return null;
        if (v instanceof String s) return s;
        if (v instanceof Boolean b) return b ? "True" : "False";
        if (v instanceof Long || v instanceof BigInteger) return v.toString();
        if (v instanceof Double d) return floatRepr(d);
        if (v instanceof byte[] raw) return bytesRepr(raw);
        return String.valueOf(v);
    }

    /** Python's {@code repr(float)}: the shortest digits that read back as {@code d}. */
    static String floatRepr(double d) {
        if (Double.isNaN(d)) return "nan";
        if (Double.isInfinite(d)) return d > 0 ? "inf" : "-inf";
        if (d == 0) return (Double.doubleToRawLongBits(d) < 0) ? "-0.0" : "0.0";
        BigDecimal exact = new BigDecimal(d);
        BigDecimal shortest = exact;
        for (int p = 1; p <= 17; p++) {
            BigDecimal r = exact.round(new java.math.MathContext(p, java.math.RoundingMode.HALF_EVEN));
            if (r.doubleValue() == d) {
                shortest = r;
                break;
            }
        }
        boolean neg = shortest.signum() < 0;
        String digits = shortest.unscaledValue().abs().toString();
        int exp = digits.length() - 1 - shortest.scale();
        while (digits.length() > 1 && digits.endsWith("0")) digits = digits.substring(0, digits.length() - 1);
        StringBuilder out = new StringBuilder(neg ? "-" : "");
        if (exp >= -4 && exp < 16) {
            BigDecimal value = new BigDecimal(new BigInteger(digits), digits.length() - 1 - exp);
            String plain = value.toPlainString();
            out.append(plain.contains(".") ? plain : plain + ".0");
        } else {
            out.append(digits.charAt(0));
            if (digits.length() > 1) out.append('.').append(digits, 1, digits.length());
            out.append('e').append(exp < 0 ? '-' : '+');
            int a = Math.abs(exp);
            if (a < 10) out.append('0');
            out.append(a);
        }
        return out.toString();
    }

    /** Python's {@code str(bytes)}: {@code b'...'}. */
    static String bytesRepr(byte[] raw) {
        boolean single = false;
        boolean dbl = false;
        for (byte b : raw) {
            if (b == '\'') single = true;
            if (b == '"') dbl = true;
        }
        char quote = single && !dbl ? '"' : '\'';
        StringBuilder out = new StringBuilder("b").append(quote);
        for (byte b : raw) {
            int c = b & 0xFF;
            if (c == quote || c == '\\') out.append('\\').append((char) c);
            else if (c == '\t') out.append("\\t");
            else if (c == '\n') out.append("\\n");
            else if (c == '\r') out.append("\\r");
            else if (c < 0x20 || c >= 0x7F) out.append(String.format(Locale.ROOT, "\\x%02x", c));
            else out.append((char) c);
        }
        return out.append(quote).toString();
    }

    // Python's datetime range: 0001-01-01 to 9999-12-31T23:59:59.999999 UTC
    private static final long MIN_SECONDS = -62135596800L;
    private static final long MAX_SECONDS = 253402300799L;

    /** The {@code timestamp} property as microseconds since the epoch; null when absent. */
    static Long micros(Object v) {
        if (v == null) return null;
        if (v instanceof Long s) {
            if (s < MIN_SECONDS || s > MAX_SECONDS) {
                throw new IllegalArgumentException("amqlite: timestamp " + s + " is out of range for a datetime");
            }
            return s * 1_000_000L;
        }
        if (v instanceof BigInteger b) {
            throw new IllegalArgumentException("amqlite: timestamp " + b + " is out of range for a datetime");
        }
        return null; // the broker only keeps integer timestamps
    }
}
