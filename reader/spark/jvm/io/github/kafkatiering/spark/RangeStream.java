package io.github.kafkatiering.spark;

import java.io.BufferedInputStream;
import java.io.Closeable;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.channels.Channels;
import java.nio.channels.FileChannel;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Duration;

/**
 * Bytes {@code [start, end)} of one object, read in order as one streamed ranged GET of a URL the driver's store
 * gave (an S3 presigned URL, or a {@code file:} URL of the filesystem store). The HTTP client reads the socket on
 * its own thread into a bounded queue, so the next bytes arrive while the task decodes. A GET that breaks or that
 * the store answers with a 5xx is asked again from the first byte not yet read (the object never changes), up to
 * {@code retries} times in a row without a byte between them, with a doubling pause; a missing object or a refused
 * URL fails at once, naming the key.
 */
final class RangeStream implements Closeable {
    private static final HttpClient HTTP = HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1)
            .connectTimeout(Duration.ofSeconds(10))
            .build();
    private static final int BUFFER = 256 << 10;

    private final String url;
    private final String key;
    private final long size;
    private final long end;
    private final int retries;
    private long position;
    private InputStream in;

    RangeStream(String url, String key, long size, long start, long end, int retries) {
        this.url = url;
        this.key = key;
        this.size = size;
        this.position = start;
        this.end = end;
        this.retries = retries;
    }

    long position() {
        return position;
    }

    /** Exactly {@code length} bytes into {@code buffer} at {@code offset}; EOFException past the range's end. */
    void readFully(byte[] buffer, int offset, int length) throws IOException {
        if (position + length > end) {
            throw new EOFException(key + ": a read of " + length + " bytes at " + position + " passes the slice's end "
                    + end);
        }
        int failures = 0;
        while (length > 0) {
            try {
                if (in == null) {
                    in = open();
                }
                int n = in.read(buffer, offset, length);
                if (n < 0) {
                    throw new EOFException("the store's answer ended at byte " + position + " of " + key);
                }
                position += n;
                offset += n;
                length -= n;
                failures = 0; // progress: a GET cut again later starts a new count
            } catch (StoreRefused e) {
                throw e;
            } catch (IOException e) {
                closeQuietly();
                if (++failures > retries) {
                    throw new IOException(key + ": reading bytes " + position + "-" + (end - 1) + " failed "
                            + failures + " times; last: " + e, e);
                }
                pause(failures);
            }
        }
    }

    private InputStream open() throws IOException {
        if (url.startsWith("file:")) {
            Path path = Path.of(URI.create(url));
            try {
                FileChannel channel = FileChannel.open(path, StandardOpenOption.READ);
                checkSize(channel.size(), channel);
                channel.position(position);
                return new BufferedInputStream(Channels.newInputStream(channel), BUFFER);
            } catch (NoSuchFileException e) {
                throw new StoreRefused("remote object missing: " + key + " (" + path + ")");
            }
        }
        HttpRequest request = HttpRequest.newBuilder(URI.create(url))
                .header("Range", "bytes=" + position + "-" + (end - 1))
                .timeout(Duration.ofSeconds(60))
                .GET()
                .build();
        HttpResponse<InputStream> response;
        try {
            response = HTTP.send(request, HttpResponse.BodyHandlers.ofInputStream());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException(key + ": interrupted", e);
        }
        int status = response.statusCode();
        InputStream body = response.body();
        if (status == 206 || (status == 200 && position == 0)) {
            String range = response.headers().firstValue("Content-Range").orElse("");
            long total = range.contains("/") ? Long.parseLong(range.substring(range.indexOf('/') + 1).trim())
                    : response.headers().firstValueAsLong("Content-Length").orElse(-1);
            checkSize(total, body);
            return new BufferedInputStream(body, BUFFER);
        }
        String answer = new String(body.readNBytes(300), java.nio.charset.StandardCharsets.UTF_8);
        body.close();
        if (status >= 500) {
            throw new IOException("HTTP " + status + " from the store: " + answer);
        }
        if (status == 404) {
            throw new StoreRefused("remote object missing: " + key);
        }
        throw new StoreRefused("remote object " + key + ": the store refused a GET of bytes " + position + "-"
                + (end - 1) + " (HTTP " + status + "; the plan's signed URLs expire 6 hours after it was made): "
                + answer);
    }

    /** The object's size is its manifest's, as the read core checks it: a longer or shorter object is not the copy. */
    private void checkSize(long total, Closeable source) throws IOException {
        if (total != size) {
            source.close();
            throw new StoreRefused("remote object " + key + " at byte " + Math.min(total, size) + ": object has "
                    + total + " bytes, the manifest says " + size);
        }
    }

    private static void pause(int failures) throws IOException {
        try {
            Thread.sleep(Math.min(100L << (failures - 1), 5_000L));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted", e);
        }
    }

    private void closeQuietly() {
        if (in != null) {
            try {
                in.close();
            } catch (IOException ignored) {
                // the stream is dropped either way
            }
            in = null;
        }
    }

    @Override
    public void close() {
        closeQuietly();
    }

    /** An answer that asking again cannot change: a missing object, a URL refused or expired. */
    static final class StoreRefused extends IOException {
        private static final long serialVersionUID = 1L;

        StoreRefused(String message) {
            super(message);
        }
    }
}
