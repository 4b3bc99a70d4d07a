package cdclake;

import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Proxy;
import java.nio.ByteBuffer;
import java.time.OffsetDateTime;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import org.apache.iceberg.MetadataColumns;
import org.apache.iceberg.Schema;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableScan;
import org.apache.iceberg.data.IcebergGenerics;
import org.apache.iceberg.data.Record;
import org.apache.iceberg.expressions.Expression;
import org.apache.iceberg.expressions.Expressions;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.spark.Spark3Util;
import org.apache.iceberg.spark.SparkSchemaUtil;
import org.apache.iceberg.types.Types;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * The rows a shared read takes from tables that hold few, read by Iceberg's generic reader in
 * the driver's JVM into one local relation for all of them, where Spark would load, plan,
 * analyse and run a scan of each table (most of a small table's read: docs/performance.md).
 * Each table's keys come prefixed with the table's own prefix, as the shared read's keys are.
 * iceberg/compaction/shared.py uses it.
 */
public final class Reads {
  private final List<Set<String>> keys = new ArrayList<>();
  private final List<String> prefixes;
  private final Dataset<Row> events;

  private Reads(
      SparkSession spark, List<String> logs, List<String> prefixes, List<List<Object>> ranges, List<String> columns)
      throws Exception {
    this.prefixes = prefixes;
    List<Expression> filters = new ArrayList<>();
    for (List<Object> r : ranges) {
      Expression any = Expressions.alwaysFalse();
      for (int i = 0; i < r.size(); i += 4) { // topic, partition, first sequence number, end
        Expression one =
            Expressions.and(
                Expressions.and(
                    Expressions.equal("topic", (String) r.get(i)),
                    Expressions.equal("partition", ((Number) r.get(i + 1)).intValue())),
                Expressions.and(
                    Expressions.greaterThanOrEqual("sequence_number", ((Number) r.get(i + 2)).longValue()),
                    Expressions.lessThan("sequence_number", ((Number) r.get(i + 3)).longValue())));
        any = Expressions.or(any, one);
      }
      filters.add(any);
      keys.add(new HashSet<>());
    }
    events = read(spark, logs, prefixes, filters, columns, "key", false, keys, null);
  }

  /**
   * Per log {@code logs.get(i)} (a Spark name), its rows in the ranges {@code ranges.get(i)}
   * (topic, partition, first sequence number, end sequence number, then the next range's):
   * their {@code columns}, {@code key} prefixed with {@code prefixes.get(i)}.
   */
  public static Reads log(
      SparkSession spark, List<String> logs, List<String> prefixes, List<List<Object>> ranges, List<String> columns)
      throws Exception {
    return new Reads(spark, logs, prefixes, ranges, columns);
  }

  /** The logs' rows read, as a frame of the session that read them. */
  public Dataset<Row> events() {
    return events;
  }

  /**
   * Per table {@code tables.get(i)} (a state or tombstone table of log i; null for none), its
   * rows whose {@code _key} is a key of log i's rows: their {@code columns} ({@code _key}
   * prefixed as log i's keys) and where each is ({@code _file}, {@code _pos}), as a frame of
   * {@code spark}.
   */
  public Dataset<Row> held(SparkSession spark, List<String> tables, List<String> columns) throws Exception {
    List<Expression> all = new ArrayList<>();
    tables.forEach(t -> all.add(Expressions.alwaysTrue()));
    return read(spark, tables, prefixes, all, columns, "_key", true, null, keys);
  }

  private static Dataset<Row> read(
      SparkSession spark,
      List<String> tables,
      List<String> prefixes,
      List<Expression> filters,
      List<String> columns,
      String key,
      boolean at,
      List<Set<String>> found,
      List<Set<String>> wanted)
      throws Exception {
    List<Row> rows = new ArrayList<>();
    StructType schema = null;
    for (int i = 0; i < tables.size(); i++) {
      if (tables.get(i) == null) {
        continue;
      }
      String name = tables.get(i);
      Table table = Tables.inSession(spark, () -> Spark3Util.loadIcebergTable(spark, name));
      List<Types.NestedField> fields = new ArrayList<>();
      for (String c : columns) {
        Types.NestedField f = table.schema().findField(c);
        if (f == null) {
          throw new IllegalArgumentException(tables.get(i) + " has no column " + c);
        }
        fields.add(f);
      }
      if (at) {
        fields.add(MetadataColumns.FILE_PATH);
        fields.add(MetadataColumns.ROW_POSITION);
      }
      Schema projection = new Schema(fields);
      StructType type = nullable(SparkSchemaUtil.convert(projection));
      if (schema == null) {
        schema = type;
      } else if (!schema.equals(type)) {
        throw new IllegalArgumentException(tables.get(i) + ": columns " + type + ", not " + schema);
      }
      int k = columns.indexOf(key);
      String prefix = prefixes.get(i);
      try (CloseableIterable<Record> records =
          IcebergGenerics.read(planningHere(table)).project(projection).where(filters.get(i)).build()) {
        for (Record r : records) {
          Object[] values = new Object[fields.size()];
          for (int c = 0; c < values.length; c++) {
            values[c] = value(r.get(c));
          }
          if (values[k] != null) { // a null key stays null, as Spark's concat leaves it
            values[k] = prefix + values[k];
            if (found != null) {
              found.get(i).add((String) values[k]);
            }
          }
          if (wanted != null && !wanted.get(i).contains(values[k])) {
            continue;
          }
          rows.add(RowFactory.create(values));
        }
      }
    }
    if (schema == null) {
      return null;
    }
    return spark.createDataFrame(rows, schema);
  }

  /**
   * {@code table}, its scans planned in the calling thread: with more than one manifest Iceberg
   * reads them on its worker pool and waits for it by polling every 10 ms (its
   * {@code ParallelIterable}), longer than a small table's planning.
   */
  private static Table planningHere(Table table) {
    return (Table)
        Proxy.newProxyInstance(
            Table.class.getClassLoader(),
            new Class<?>[] {Table.class},
            (proxy, method, args) -> {
              Object out;
              try {
                out = method.invoke(table, args);
              } catch (InvocationTargetException e) {
                throw e.getCause();
              }
              return method.getName().equals("newScan") ? ((TableScan) out).planWith(DeltaWriter.IN_THIS_THREAD) : out;
            });
  }

  /** {@code type} with every field nullable: the frame holds the rows of tables that may differ in it. */
  private static StructType nullable(StructType type) {
    List<StructField> fields = new ArrayList<>();
    for (StructField f : type.fields()) {
      fields.add(new StructField(f.name(), f.dataType(), true, f.metadata()));
    }
    return new StructType(fields.toArray(new StructField[0]));
  }

  /** A generic record's value as Spark takes it in a row. */
  private static Object value(Object v) {
    if (v instanceof OffsetDateTime t) {
      return t.toInstant();
    }
    if (v instanceof CharSequence s) {
      return s.toString();
    }
    if (v instanceof ByteBuffer b) {
      byte[] bytes = new byte[b.remaining()];
      b.duplicate().get(bytes);
      return bytes;
    }
    return v;
  }
}
