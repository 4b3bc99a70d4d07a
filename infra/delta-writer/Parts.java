package cdclake;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * A frame's rows collected into the driver's JVM once (one job) and kept in parts by an int
 * column, each part a frame of its own rows alone, in whichever session asks for it. Spark's
 * analysis and optimizer walk every row of a local relation (its rows are a field of the plan
 * node), so the queries of one part of a relation holding every part's rows would cost as
 * many rows as all of them. iceberg/compaction/shared.py uses it for the rounds of a shared read.
 */
public final class Parts {
  private final Map<Integer, List<Row>> parts = new HashMap<>();
  private final StructType schema;

  private Parts(Dataset<Row> rows, String column) {
    StructType all = rows.schema();
    int at = all.fieldIndex(column);
    List<StructField> kept = new ArrayList<>(Arrays.asList(all.fields()));
    kept.remove(at);
    schema = new StructType(kept.toArray(new StructField[0]));
    for (Row r : rows.collectAsList()) {
      Object[] values = new Object[r.size() - 1];
      for (int i = 0, j = 0; i < r.size(); i++) {
        if (i != at) {
          values[j++] = r.get(i);
        }
      }
      parts.computeIfAbsent(r.getInt(at), k -> new ArrayList<>()).add(RowFactory.create(values));
    }
  }

  /** {@code rows} (one job) in parts by their int {@code column}, which the parts leave out. */
  public static Parts of(Dataset<Row> rows, String column) {
    return new Parts(rows, column);
  }

  /** Part {@code index}'s rows (none if it has none) as a frame of {@code session}. */
  public Dataset<Row> part(SparkSession session, int index) {
    return session.createDataFrame(parts.getOrDefault(index, List.of()), schema);
  }
}
