package dbsp;

import java.nio.charset.StandardCharsets;

/**
 * The record decoder's fast path: one pass over a value's bytes for the one shape producers
 * send most, a flat JSON object of ASCII keys and of numbers, ASCII strings without escapes,
 * booleans and nulls.  It returns the decoded row (the columns, then the weight) only where
 * it is sure {@link RecordDecoder}'s Jackson path would return the same row; for anything
 * else (an escape, a byte above 0x7f, a nested value, a value of another kind than its
 * column's, a duplicate or missing column, a number Jackson would read differently) it
 * returns null and the Jackson path decides.  So it changes how fast a row comes, never
 * which row.
 */
final class FlatScanner {
    private static final byte[] WEIGHT = "_weight".getBytes(StandardCharsets.US_ASCII);
    /** Digits of a long that cannot overflow: longer integers are Jackson's to read. */
    private static final int SAFE_DIGITS = 18;

    private final byte[] value;
    private int at;
    // The last number scanned: its long value when integral, else its text's bounds.
    private boolean integral;
    private long number;
    private int numberStart;

    private FlatScanner(byte[] value) {
        this.value = value;
    }

    /** The row of {@code columns} and the weight, or null when the Jackson path must decide. */
    static Object[] scan(byte[] value, RecordDecoder.Column[] columns) {
        return columns.length > 64 ? null : new FlatScanner(value).object(columns);
    }

    private Object[] object(RecordDecoder.Column[] columns) {
        Object[] row = new Object[columns.length + 1];
        long seen = 0;
        Long weight = null;
        skipSpace();
        if (!take('{')) {
            return null;
        }
        skipSpace();
        if (!take('}')) {
            do {
                skipSpace();
                int keyStart = at + 1;
                if (!string()) {
                    return null;
                }
                int keyEnd = at - 1;
                skipSpace();
                if (!take(':')) {
                    return null;
                }
                skipSpace();
                if (same(keyStart, keyEnd, WEIGHT)) {
                    if (weight != null || !number() || !integral || number == 0) {
                        return null;
                    }
                    weight = number;
                } else {
                    int i = indexOf(columns, keyStart, keyEnd);
                    if (i >= 0 && (seen & (1L << i)) != 0) {
                        return null;
                    }
                    if (i >= 0) {
                        seen |= 1L << i;
                    }
                    if (!value(row, i, i < 0 ? null : columns[i].kind())) {
                        return null;
                    }
                }
                skipSpace();
            } while (take(','));
            if (!take('}')) {
                return null;
            }
        }
        skipSpace();
        if (at != value.length || seen != (columns.length == 64 ? -1L : (1L << columns.length) - 1)) {
            return null;
        }
        row[columns.length] = weight == null ? 1L : weight;
        return row;
    }

    /**
     * Scans one scalar value into {@code row[i]} (i < 0: a key no column has, skipped), as
     * a column of {@code kind}; false when the Jackson path must decide.
     */
    private boolean value(Object[] row, int i, RecordDecoder.Kind kind) {
        if (at >= value.length) {
            return false;
        }
        byte first = value[at];
        if (first == 'n') {
            return word("null");
        }
        if (first == 't' || first == 'f') {
            boolean truth = first == 't';
            if (!word(truth ? "true" : "false")) {
                return false;
            }
            if (i >= 0) {
                if (kind != RecordDecoder.Kind.BOOLEAN) {
                    return false;
                }
                row[i] = truth;
            }
            return true;
        }
        if (first == '"') {
            int start = at + 1;
            if (!string()) {
                return false;
            }
            if (i >= 0) {
                if (kind != RecordDecoder.Kind.STRING) {
                    return false;
                }
                // ASCII only (see string()), so Latin-1 decodes it as UTF-8 would.
                row[i] = new String(value, start, at - 1 - start, StandardCharsets.ISO_8859_1);
            }
            return true;
        }
        if (!number()) {
            return false;
        }
        if (i < 0) {
            return true;
        }
        Object decoded = numeric(kind);
        row[i] = decoded;
        return decoded != null;
    }

    /** The last number as a column of {@code kind}, or null when the Jackson path must decide. */
    private Object numeric(RecordDecoder.Kind kind) {
        switch (kind) {
            case LONG:
                return integral ? (Object) number : null;
            case INT:
                return integral && number == (int) number ? (Object) (int) number : null;
            case SHORT:
                return integral && number == (short) number ? (Object) (short) number : null;
            case BYTE:
                return integral && number == (byte) number ? (Object) (byte) number : null;
            case DOUBLE:
                // Jackson reads an integer token as its long converted, any other with Double.parseDouble.
                return integral ? (Object) (double) number
                        : (Object) Double.parseDouble(new String(value, numberStart, at - numberStart, StandardCharsets.ISO_8859_1));
            default:
                return null;
        }
    }

    /**
     * Scans a JSON number (RFC 8259's grammar: no leading zeros, no bare dot); false for
     * anything else, or an integer too long to be sure of.
     */
    private boolean number() {
        numberStart = at;
        boolean negative = take('-');
        int digits = at;
        if (take('0')) {
            // a leading zero stands alone
        } else if (!digits()) {
            return false;
        }
        digits = at - digits;
        integral = true;
        if (take('.')) {
            integral = false;
            if (!digits()) {
                return false;
            }
        }
        if (take('e') || take('E')) {
            integral = false;
            if (!take('+')) {
                take('-');
            }
            if (!digits()) {
                return false;
            }
        }
        if (integral) {
            if (digits > SAFE_DIGITS) {
                return false;
            }
            long n = 0;
            for (int j = at - digits; j < at; j++) {
                n = n * 10 + (value[j] - '0');
            }
            number = negative ? -n : n;
        }
        return true;
    }

    private boolean digits() {
        int start = at;
        while (at < value.length && value[at] >= '0' && value[at] <= '9') {
            at++;
        }
        return at > start;
    }

    /** Scans a string of printable ASCII without escapes, quotes included. */
    private boolean string() {
        if (!take('"')) {
            return false;
        }
        while (at < value.length) {
            byte b = value[at++];
            if (b == '"') {
                return true;
            }
            // A byte is signed: above 0x7f it is negative, as a control character is below 0x20.
            if (b == '\\' || b < 0x20) {
                return false;
            }
        }
        return false;
    }

    private boolean word(String word) {
        if (at + word.length() > value.length) {
            return false;
        }
        for (int j = 0; j < word.length(); j++) {
            if (value[at + j] != word.charAt(j)) {
                return false;
            }
        }
        at += word.length();
        return true;
    }

    private boolean take(char c) {
        if (at < value.length && value[at] == c) {
            at++;
            return true;
        }
        return false;
    }

    private void skipSpace() {
        while (at < value.length) {
            byte b = value[at];
            if (b != ' ' && b != '\t' && b != '\n' && b != '\r') {
                return;
            }
            at++;
        }
    }

    private int indexOf(RecordDecoder.Column[] columns, int start, int end) {
        for (int i = 0; i < columns.length; i++) {
            if (same(start, end, columns[i].key())) {
                return i;
            }
        }
        return -1;
    }

    private boolean same(int start, int end, byte[] key) {
        if (end - start != key.length) {
            return false;
        }
        for (int j = 0; j < key.length; j++) {
            if (value[start + j] != key[j]) {
                return false;
            }
        }
        return true;
    }
}
