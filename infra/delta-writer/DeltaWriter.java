package cdclake;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.reflect.Field;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ExecutorService;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.DataFiles;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.ManifestFile;
import org.apache.iceberg.ManifestFiles;
import org.apache.iceberg.MetricsConfig;
import org.apache.iceberg.RowDelta;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.Table;
import org.apache.iceberg.Transaction;
import org.apache.iceberg.UpdateSchema;
import org.apache.iceberg.data.BaseDeleteLoader;
import org.apache.iceberg.deletes.BaseDVFileWriter;
import org.apache.iceberg.deletes.PositionDeleteIndex;
import org.apache.iceberg.encryption.EncryptedOutputFile;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.io.DeleteWriteResult;
import org.apache.iceberg.io.FileAppender;
import org.apache.iceberg.io.OutputFileFactory;
import org.apache.iceberg.parquet.Parquet;
import org.apache.iceberg.relocated.com.google.common.util.concurrent.MoreExecutors;
import org.apache.iceberg.spark.Spark3Util;
import org.apache.iceberg.spark.SparkSchemaUtil;
import org.apache.iceberg.spark.data.SparkParquetWriters;
import org.apache.iceberg.types.Type;
import org.apache.iceberg.util.ContentFileUtil;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * A compaction round's write to one table in one snapshot, through Iceberg's API instead of a
 * MERGE (which plans a scan of the table, joins it with the changes and commits): the rows to
 * add as one data file, the rows to remove by their file and position as deletion vectors
 * (each merged with its data file's earlier one, which it replaces), and the snapshot's
 * properties. Compiled by infra/fetch-jars.sh into .cache/jars, on the driver's class path
 * with Spark's other jars; iceberg/compaction/writes.py calls it.
 */
public final class DeltaWriter {
  // runs each task in the calling thread (the commits' manifest work below, `Reads`' scans)
  static final ExecutorService IN_THIS_THREAD = MoreExecutors.newDirectExecutorService();
  // Iceberg's Parquet writer makes a new Hadoop configuration for each file not written through
  // Hadoop, and loading it parses Hadoop's default XML resources out of the jars (about 10 ms a
  // file): each data file's writer gets a copy of one loaded here
  private static final Configuration HADOOP = loaded();
  private static final Field WRITER_CONF = writerConf();

  private DeltaWriter() {}

  /**
   * Commits to table {@code name} (its Spark name), from {@code changes} (one row per changed
   * key), the rows whose {@code _action} is {@code keep} (by column name; a column they lack is
   * null) and the removal of each row a changed key held, which the struct column {@code held}
   * locates ({@code held._at._file}, {@code held._at._pos}, read at snapshot {@code base} or
   * later; null: none), with {@code properties} in the snapshot's summary: one query for both.
   * The commit fails if, since {@code base} (-1: the table had none), another added data files,
   * deleted the files the deletes reference or wrote deletes of its own: a writer that lost its
   * lease cannot overwrite the new one's work. {@code add} and {@code widen} (name, Spark type,
   * name, type, ...) change the table's columns in the same commit: the columns added (in their
   * order), then those widened. Returns the new snapshot's id.
   */
  public static long commit(
      SparkSession spark,
      String name,
      Dataset<Row> changes,
      String keep,
      String held,
      Map<String, String> properties,
      long base,
      List<String> add,
      List<String> widen)
      throws Exception {
    Transaction tx = Spark3Util.loadIcebergTable(spark, name).newTransaction();
    if (!add.isEmpty() || !widen.isEmpty()) {
      UpdateSchema columns = tx.updateSchema();
      for (int i = 0; i < add.size(); i += 2) {
        columns.addColumn(null, add.get(i), SparkSchemaUtil.convert(DataType.fromDDL(add.get(i + 1))));
      }
      for (int i = 0; i < widen.size(); i += 2) {
        Type to = SparkSchemaUtil.convert(DataType.fromDDL(widen.get(i + 1)));
        columns.updateColumn(widen.get(i), to.asPrimitiveType());
      }
      columns.commit();
    }
    Table table = tx.table();
    if (!table.spec().isUnpartitioned()) {
      throw new IllegalStateException(
          name + " is partitioned (" + table.spec() + "); the compaction writes its state and tombstones "
              + "unpartitioned: drop the partition spec (ALTER TABLE ... DROP PARTITION FIELD)");
    }
    OutputFileFactory files =
        OutputFileFactory.builderFor(table, 0, 0).format(FileFormat.PARQUET).build();
    // its manifests read, filtered and merged in this thread: Iceberg's worker pool is waited
    // for by polling every 10 ms (`Tasks.waitFor`), longer than a small commit's work
    RowDelta delta = tx.newRowDelta().scanManifestsWith(IN_THIS_THREAD);
    StructType columns = SparkSchemaUtil.convert(table.schema());
    int n = columns.size(); // each row: the table's columns, then its action and held row
    List<InternalRow> added = new ArrayList<>();
    Map<String, List<Long>> byFile = new HashMap<>();
    for (InternalRow r : typed(changes, columns, held).queryExecution().executedPlan().executeCollect()) {
      if (!r.isNullAt(n) && r.getUTF8String(n).toString().equals(keep)) {
        added.add(r); // the writer reads the first n columns
      }
      if (!r.isNullAt(n + 1)) {
        byFile.computeIfAbsent(r.getUTF8String(n + 1).toString(), k -> new ArrayList<>()).add(r.getLong(n + 2));
      }
    }
    if (!added.isEmpty()) {
      delta.addRows(writeData(table, files.newOutputFile(), columns, added));
    }
    if (!byFile.isEmpty()) {
      Snapshot current = table.currentSnapshot();
      Map<String, List<DeleteFile>> previous = previousDeletes(table, current, byFile);
      BaseDeleteLoader loader = new BaseDeleteLoader(f -> table.io().newInputFile(f));
      OutputFileFactory dvs =
          OutputFileFactory.builderFor(table, 0, 1).format(FileFormat.PUFFIN).build();
      BaseDVFileWriter writer =
          new BaseDVFileWriter(
              dvs,
              path -> previous.containsKey(path) ? loader.loadPositionDeletes(previous.get(path), path) : null);
      try (writer) {
        for (Map.Entry<String, List<Long>> e : byFile.entrySet()) {
          for (long pos : e.getValue()) {
            writer.delete(e.getKey(), pos, table.spec(), null);
          }
        }
      }
      DeleteWriteResult result = writer.result();
      result.deleteFiles().forEach(delta::addDeletes);
      result.rewrittenDeleteFiles().forEach(delta::removeDeletes);
      delta.validateDataFilesExist(result.referencedDataFiles());
    }
    properties.forEach(delta::set);
    if (base >= 0) {
      delta.validateFromSnapshot(base);
    }
    delta.validateDeletedFiles().validateNoConflictingDataFiles().validateNoConflictingDeleteFiles();
    delta.commit();
    tx.commitTransaction();
    return tx.table().currentSnapshot().snapshotId();
  }

  /**
   * {@code changes} as the table's columns, in its order and types (a column they lack: null),
   * then {@code _action} and the file and position of the row in {@code held}.
   */
  private static Dataset<Row> typed(Dataset<Row> changes, StructType table, String held) {
    Set<String> have = new HashSet<>(Arrays.asList(changes.columns()));
    List<Column> columns = new ArrayList<>();
    for (StructField f : table.fields()) {
      String quoted = "`" + f.name().replace("`", "``") + "`"; // a name may hold dots
      Column c = have.contains(f.name()) ? changes.col(quoted) : functions.lit(null);
      columns.add(c.cast(f.dataType()).as(f.name()));
    }
    columns.add(changes.col("_action"));
    columns.add(changes.col(held + "._at._file"));
    columns.add(changes.col(held + "._at._pos"));
    return changes.select(columns.toArray(new Column[0]));
  }

  private static DataFile writeData(Table table, EncryptedOutputFile out, StructType sparkType, List<InternalRow> rows)
      throws IOException, IllegalAccessException {
    Parquet.WriteBuilder builder = Parquet.write(out);
    if (WRITER_CONF != null) {
      WRITER_CONF.set(builder, new Configuration(HADOOP));
    }
    FileAppender<InternalRow> appender =
        builder
            .schema(table.schema())
            .createWriterFunc(msg -> SparkParquetWriters.buildWriter(table.schema(), msg, sparkType))
            .setAll(table.properties())
            .metricsConfig(MetricsConfig.forTable(table))
            .overwrite()
            .build();
    try (appender) {
      for (InternalRow r : rows) {
        appender.add(r);
      }
    }
    return DataFiles.builder(table.spec())
        .withEncryptedOutputFile(out)
        .withFormat(FileFormat.PARQUET)
        .withFileSizeInBytes(appender.length())
        .withMetrics(appender.metrics())
        .withSplitOffsets(appender.splitOffsets())
        .build();
  }

  private static Configuration loaded() {
    Configuration conf = new Configuration();
    conf.size(); // its resources parsed now, once
    return conf;
  }

  /**
   * The field of Iceberg's Parquet write builder holding its Hadoop configuration, or null where
   * it has none of that name (each writer then loads its own, as Iceberg does). A contract test
   * (tests/iceberg/test_compat_spark.py) checks it is found in the pinned Iceberg.
   */
  private static Field writerConf() {
    try {
      Field f = Parquet.WriteBuilder.class.getDeclaredField("conf");
      f.setAccessible(true);
      return f.getType() == Configuration.class ? f : null;
    } catch (ReflectiveOperationException | RuntimeException e) {
      return null;
    }
  }

  /** Whether each data file's writer gets a copy of one loaded Hadoop configuration. */
  public static boolean sharesHadoopConf() {
    return WRITER_CONF != null;
  }

  /** The live delete files of `snapshot` that reference the data files in `paths`. */
  private static Map<String, List<DeleteFile>> previousDeletes(
      Table table, Snapshot snapshot, Map<String, ?> paths) throws IOException {
    Map<String, List<DeleteFile>> out = new HashMap<>();
    if (snapshot == null) {
      return out;
    }
    for (ManifestFile m : snapshot.deleteManifests(table.io())) {
      try (CloseableIterable<DeleteFile> entries =
          ManifestFiles.readDeleteManifest(m, table.io(), table.specs())) {
        for (DeleteFile f : entries) {
          String ref = ContentFileUtil.referencedDataFileLocation(f);
          if (ref != null && paths.containsKey(ref)) {
            out.computeIfAbsent(ref, k -> new ArrayList<>()).add(f.copy());
          }
        }
      }
    }
    return out;
  }
}
