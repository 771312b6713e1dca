package dbsp;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF2;

/**
 * A Kafka record's value decoded on the executor, in one pass of Jackson's streaming parser:
 * the row of the topic's columns followed by its weight, or null when the decoder cannot
 * vouch for the record.
 *
 * <p>The rules are those of the engine's Python decoder ({@code sensors/decode.py} and
 * {@code sensors/values.py}), which stays their definition: this class returns a row only
 * for a value that decoder accepts, with the values Spark's {@code from_json} gives for it,
 * and null for everything else (a malformed value, a duplicate key, trailing text, a column
 * of a type other than an integer, a floating-point number, a string or a boolean that is
 * not null, a weight other than a nonzero bigint).  The engine hands the null rows to the
 * Python decoder, which accepts them or writes the dead letter with its reason.  So a row
 * comes out the same whichever decoder took it, and the common case, a valid record of
 * plain columns, never leaves the JVM.
 *
 * <p>Called as {@code decoder(value, schema)}, {@code schema} being the topic's columns, each
 * written {@code <kind><length>:<name>} (kinds {@code l i s b d f}: bigint to float, {@code
 * S} string, {@code z} boolean, any other character: another type), the name's length in
 * UTF-16 units; registered with the return type of those columns followed by {@code _weight
 * bigint}.  The schema is short because Spark passes it as a new string with every record,
 * which the decoder looks up.
 *
 * <p>Most values never reach Jackson: {@link FlatScanner} reads a flat object of plain
 * values in one pass over its bytes and hands Jackson only what it is not sure of.
 */
public final class RecordDecoder implements UDF2<byte[], String, Row> {
    private static final long serialVersionUID = 1L;
    private static final String WEIGHT = "_weight";
    // Jackson's defaults are strict JSON: no comments, single quotes, NaN, leading zeros or
    // trailing commas, which the Python decoder refuses too.
    private static final JsonFactory JSON = new JsonFactory();
    private static final ConcurrentHashMap<String, Column[]> SCHEMAS = new ConcurrentHashMap<>();

    enum Kind { LONG, INT, SHORT, BYTE, DOUBLE, FLOAT, STRING, BOOLEAN, OTHER }

    /** A column: its name, and the name's UTF-8 bytes, which {@link FlatScanner} matches keys with. */
    record Column(String name, byte[] key, Kind kind) {
        Column(String name, Kind kind) {
            this(name, name.getBytes(StandardCharsets.UTF_8), kind);
        }
    }

    @Override
    public Row call(byte[] value, String schema) {
        if (value == null) {
            return null;
        }
        Column[] columns = SCHEMAS.computeIfAbsent(schema, RecordDecoder::columns);
        Object[] row = FlatScanner.scan(value, columns);
        if (row != null) {
            return RowFactory.create(row);
        }
        try {
            return decode(value, columns);
        } catch (IOException e) {
            // Malformed JSON, invalid UTF-8, a number out of Jackson's limits: the Python
            // decoder names the reason.
            return null;
        }
    }

    /** The columns of a schema written as {@code <kind><length>:<name>} each, in order. */
    private static Column[] columns(String schema) {
        List<Column> columns = new ArrayList<>();
        int at = 0;
        while (at < schema.length()) {
            int colon = schema.indexOf(':', at + 1);
            int end = colon + 1 + Integer.parseInt(schema, at + 1, colon, 10);
            columns.add(new Column(schema.substring(colon + 1, end), kind(schema.charAt(at))));
            at = end;
        }
        return columns.toArray(new Column[0]);
    }

    private static Kind kind(char code) {
        switch (code) {
            case 'l': return Kind.LONG;
            case 'i': return Kind.INT;
            case 's': return Kind.SHORT;
            case 'b': return Kind.BYTE;
            case 'd': return Kind.DOUBLE;
            case 'f': return Kind.FLOAT;
            case 'S': return Kind.STRING;
            case 'z': return Kind.BOOLEAN;
            default: return Kind.OTHER;
        }
    }

    private static Row decode(byte[] value, Column[] columns) throws IOException {
        Object[] row = new Object[columns.length + 1];
        boolean[] seen = new boolean[columns.length];
        Long weight = null;
        try (JsonParser parser = JSON.createParser(value)) {
            if (parser.nextToken() != JsonToken.START_OBJECT) {
                return null;
            }
            while (parser.nextToken() == JsonToken.FIELD_NAME) {
                String name = parser.currentName();
                JsonToken token = parser.nextToken();
                if (WEIGHT.equals(name)) {
                    // Python keeps a duplicate key's last value: a duplicate is left to it.
                    if (weight != null || !isLong(parser, token) || parser.getLongValue() == 0) {
                        return null;
                    }
                    weight = parser.getLongValue();
                    continue;
                }
                int i = indexOf(columns, name);
                if (i < 0) {
                    parser.skipChildren();
                    continue;
                }
                if (seen[i]) {
                    return null;
                }
                seen[i] = true;
                if (token != JsonToken.VALUE_NULL) {
                    row[i] = value(parser, token, columns[i].kind());
                    if (row[i] == null) {
                        return null;
                    }
                }
            }
            // After the object's end only whitespace may follow, as json.loads requires.
            if (parser.nextToken() != null) {
                return null;
            }
        }
        for (boolean present : seen) {
            if (!present) {
                return null;
            }
        }
        row[columns.length] = weight == null ? 1L : weight;
        return RowFactory.create(row);
    }

    private static int indexOf(Column[] columns, String name) {
        for (int i = 0; i < columns.length; i++) {
            if (columns[i].name().equals(name)) {
                return i;
            }
        }
        return -1;
    }

    private static boolean isLong(JsonParser parser, JsonToken token) throws IOException {
        return token == JsonToken.VALUE_NUMBER_INT && parser.getNumberType() != JsonParser.NumberType.BIG_INTEGER;
    }

    /** The column's value of a non-null token, or null when the Python decoder must judge it. */
    private static Object value(JsonParser parser, JsonToken token, Kind kind) throws IOException {
        switch (kind) {
            case LONG:
                return isLong(parser, token) ? parser.getLongValue() : null;
            case INT:
                return isLong(parser, token) && inRange(parser.getLongValue(), Integer.MIN_VALUE, Integer.MAX_VALUE)
                        ? (Object) (int) parser.getLongValue() : null;
            case SHORT:
                return isLong(parser, token) && inRange(parser.getLongValue(), Short.MIN_VALUE, Short.MAX_VALUE)
                        ? (Object) (short) parser.getLongValue() : null;
            case BYTE:
                return isLong(parser, token) && inRange(parser.getLongValue(), Byte.MIN_VALUE, Byte.MAX_VALUE)
                        ? (Object) (byte) parser.getLongValue() : null;
            case DOUBLE:
                // Spark's from_json reads either kind of number with the same calls.
                return isNumber(parser, token) ? (Object) parser.getDoubleValue() : null;
            case FLOAT:
                return isNumber(parser, token) ? (Object) parser.getFloatValue() : null;
            case STRING:
                return token == JsonToken.VALUE_STRING ? parser.getText() : null;
            case BOOLEAN:
                return token == JsonToken.VALUE_TRUE ? Boolean.TRUE : token == JsonToken.VALUE_FALSE ? Boolean.FALSE : null;
            default:
                return null;
        }
    }

    private static boolean isNumber(JsonParser parser, JsonToken token) throws IOException {
        return isLong(parser, token) || token == JsonToken.VALUE_NUMBER_FLOAT;
    }

    private static boolean inRange(long value, long low, long high) {
        return low <= value && value <= high;
    }
}
