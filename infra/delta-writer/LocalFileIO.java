package cdclake;

import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import org.apache.hadoop.fs.Path;
import org.apache.iceberg.Files;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.io.InputFile;
import org.apache.iceberg.io.OutputFile;
import org.apache.iceberg.io.PositionOutputStream;
import org.apache.iceberg.io.SeekableInputStream;

/**
 * Iceberg's files in a local warehouse through Java's file API ({@link Files#localInput},
 * {@link Files#localOutput}), where Iceberg's default ({@code HadoopFileIO}) goes through
 * Hadoop's local file system: without Hadoop's native library (PySpark ships none) that starts
 * a {@code chmod} process for every file and directory it creates, and writes a checksum file
 * beside each. A file keeps the location it was given ({@code file:/...} in the tables'
 * metadata, as before). iceberg/spark.py makes it the catalog's {@code io-impl} for a local
 * warehouse.
 */
public class LocalFileIO implements FileIO {
  @Override
  public InputFile newInputFile(String location) {
    return new In(location);
  }

  @Override
  public OutputFile newOutputFile(String location) {
    return new Out(location);
  }

  @Override
  public void deleteFile(String location) {
    try {
      java.nio.file.Files.deleteIfExists(file(location).toPath());
    } catch (IOException e) {
      throw new UncheckedIOException("cannot delete " + location, e);
    }
  }

  /** The local file at {@code location}: a path, or a {@code file:} URI as Hadoop reads it. */
  static File file(String location) {
    return new File(new Path(location).toUri().getPath());
  }

  /** The file at {@code location}, its directory made where missing (tasks writing into the same new one at once). */
  static File withDirectory(String location) {
    File f = file(location);
    try {
      java.nio.file.Files.createDirectories(f.toPath().getParent());
    } catch (IOException e) {
      throw new UncheckedIOException("cannot create the directory of " + location, e);
    }
    return f;
  }

  record In(String location) implements InputFile {
    @Override
    public long getLength() {
      return Files.localInput(file(location)).getLength();
    }

    @Override
    public SeekableInputStream newStream() {
      return Files.localInput(file(location)).newStream();
    }

    @Override
    public boolean exists() {
      return file(location).exists();
    }
  }

  record Out(String location) implements OutputFile {
    @Override
    public PositionOutputStream create() {
      return Files.localOutput(withDirectory(location)).create();
    }

    @Override
    public PositionOutputStream createOrOverwrite() {
      return Files.localOutput(withDirectory(location)).createOrOverwrite();
    }

    @Override
    public InputFile toInputFile() {
      return new In(location);
    }
  }
}
