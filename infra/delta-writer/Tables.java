package cdclake;

import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.analysis.TableAlreadyExistsException;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.TableCatalog;
import org.apache.spark.sql.connector.catalog.TableInfo;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import scala.Option;

/**
 * Tables created through Spark's catalog API: what {@code CREATE TABLE IF NOT EXISTS} does,
 * without a statement to parse, analyse and plan (most of the statement's cost for a small
 * table: docs/performance.md).
 * iceberg/compaction/schema.py calls it.
 */
public final class Tables {
  private Tables() {}

  /**
   * Creates in Spark's catalog {@code catalog} each table of {@code tables} (its name as
   * {@code namespace.table}, then its columns as DDL, then the next table's name, ...) that
   * does not exist yet, unpartitioned, with {@code properties}.
   */
  public static void create(
      SparkSession spark, String catalog, List<String> tables, Map<String, String> properties)
      throws Exception {
    inSession(
        spark,
        () -> {
          create((TableCatalog) spark.sessionState().catalogManager().catalog(catalog), tables, properties);
          return null;
        });
  }

  /**
   * {@code work}'s result, run with {@code spark} the active session: a catalog's settings are
   * those of the active session (a statement sets it; a call from Python runs in a thread that
   * may have none or another).
   */
  static <T> T inSession(SparkSession spark, Callable<T> work) throws Exception {
    Option<SparkSession> active = SparkSession.getActiveSession();
    SparkSession.setActiveSession(spark);
    try {
      return work.call();
    } finally {
      if (active.isDefined()) {
        SparkSession.setActiveSession(active.get());
      } else {
        SparkSession.clearActiveSession();
      }
    }
  }

  private static void create(
      TableCatalog target, List<String> tables, Map<String, String> properties) throws Exception {
    for (int i = 0; i < tables.size(); i += 2) {
      String[] parts = tables.get(i).split("\\.");
      String name = parts[parts.length - 1];
      Identifier id = Identifier.of(Arrays.copyOf(parts, parts.length - 1), name);
      if (target.tableExists(id)) {
        continue;
      }
      StructField[] fields = StructType.fromDDL(tables.get(i + 1)).fields();
      Column[] columns = new Column[fields.length];
      for (int f = 0; f < fields.length; f++) {
        columns[f] = Column.create(fields[f].name(), fields[f].dataType(), fields[f].nullable());
      }
      try {
        TableInfo table =
            new TableInfo.Builder()
                .withColumns(columns)
                .withPartitions(new Transform[0])
                .withProperties(properties)
                .build();
        target.createTable(id, table);
      } catch (TableAlreadyExistsException e) {
        // another writer created it meanwhile: as IF NOT EXISTS
      }
    }
  }
}
