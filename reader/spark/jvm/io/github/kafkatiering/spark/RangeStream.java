package io.github.kafkatiering.spark;

import java.io.Closeable;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.Arrays;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;

/**
 * Bytes {@code [start, end)} of one object, read in order through a URL the driver's store gave (an S3 presigned
 * URL, or a {@code file:} URL of the filesystem store), as windows of {@code window} bytes: one ranged GET each,
 * {@code ahead} of them in flight while the task decodes the one it holds (the read core's read-ahead, bounded:
 * at most {@code ahead + 1} windows in memory). Every answer's object size is checked against the manifest's.
 * A window whose GET breaks or that the store answers with a 5xx is asked again, up to {@code retries} times with
 * a doubling pause; a missing object, a refused URL or a size that is not the manifest's fails at once, naming
 * the key.
 */
final class RangeStream implements Closeable {
    private static final HttpClient HTTP = HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1)
            .connectTimeout(Duration.ofSeconds(10))
            .build();

    private final String url;
    private final String key;
    private final long size;
    private final long end;
    private final int window;
    private final int ahead;
    private final int retries;
    private final ArrayDeque<Window> pending = new ArrayDeque<>();
    private long requested; // where the next window to ask for starts
    private byte[] current = new byte[0];
    private long currentStart;
    private int used; // bytes of ``current`` taken
    private byte[] scratch = new byte[0]; // a take that spans two windows is assembled here

    private record Window(long start, int length, CompletableFuture<byte[]> body) {}

    RangeStream(String url, String key, long size, long start, long end, int window, int ahead, int retries) {
        this.url = url;
        this.key = key;
        this.size = size;
        this.end = end;
        this.window = window;
        this.ahead = ahead;
        this.retries = retries;
        this.requested = start;
        this.currentStart = start;
        fill();
    }

    /** The next byte not yet taken. */
    long position() {
        return currentStart + used;
    }

    /**
     * The next {@code length} bytes, as a buffer valid until the next call (a view of the window that holds them,
     * or a copy when they span two). The caller checks {@code length} against the range's end.
     */
    ByteBuffer take(int length) throws IOException {
        if (current.length - used >= length) {
            ByteBuffer view = ByteBuffer.wrap(current, used, length).slice();
            used += length;
            return view;
        }
        if (scratch.length < length) {
            scratch = new byte[Math.max(length, 2 * scratch.length)];
        }
        int filled = 0;
        while (filled < length) {
            if (used == current.length) {
                advance();
            }
            int n = Math.min(length - filled, current.length - used);
            System.arraycopy(current, used, scratch, filled, n);
            used += n;
            filled += n;
        }
        return ByteBuffer.wrap(scratch, 0, length).slice();
    }

    private void advance() throws IOException {
        Window next = pending.poll();
        if (next == null) {
            throw new IOException("remote object " + key + ": a read past the slice's end at byte " + end);
        }
        currentStart += current.length;
        current = await(next);
        used = 0;
        fill();
    }

    private void fill() {
        while (pending.size() < ahead && requested < end) {
            int length = (int) Math.min(window, end - requested);
            pending.add(new Window(requested, length, fetch(requested, length)));
            requested += length;
        }
    }

    /** The window's bytes; asked again after a failure that another attempt may not see. */
    private byte[] await(Window w) throws IOException {
        CompletableFuture<byte[]> body = w.body();
        for (int failures = 0; ; failures++) {
            try {
                return body.get();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IOException("interrupted reading " + key, e);
            } catch (ExecutionException e) {
                Throwable cause = e.getCause();
                while ((cause instanceof CompletionException || cause instanceof UncheckedIOException)
                        && cause.getCause() != null) {
                    cause = cause.getCause();
                }
                if (cause instanceof StoreRefused refused) {
                    throw refused;
                }
                if (failures >= retries) {
                    throw new IOException("remote object " + key + ": reading bytes " + w.start() + "-"
                            + (w.start() + w.length() - 1) + " failed " + (failures + 1) + " times; last: " + cause,
                            cause);
                }
                pause(failures + 1);
                body = fetch(w.start(), w.length());
            }
        }
    }

    private CompletableFuture<byte[]> fetch(long from, int length) {
        if (url.startsWith("file:")) {
            try {
                return CompletableFuture.completedFuture(readFile(from, length));
            } catch (IOException e) {
                return CompletableFuture.failedFuture(e);
            }
        }
        HttpRequest request = HttpRequest.newBuilder(URI.create(url))
                .header("Range", "bytes=" + from + "-" + (from + length - 1))
                .timeout(Duration.ofSeconds(60))
                .GET()
                .build();
        return HTTP.sendAsync(request, HttpResponse.BodyHandlers.ofByteArray())
                .thenApply(response -> answer(response, from, length));
    }

    private byte[] answer(HttpResponse<byte[]> response, long from, int length) {
        int status = response.statusCode();
        byte[] body = response.body();
        try {
            if (status == 206 || (status == 200 && from == 0)) {
                String range = response.headers().firstValue("Content-Range").orElse("");
                checkSize(range.contains("/") ? Long.parseLong(range.substring(range.indexOf('/') + 1).trim())
                        : body.length);
                if (body.length < length) {
                    throw new IOException("remote object " + key + ": " + body.length + " bytes came for the "
                            + length + " asked at byte " + from);
                }
                return body.length == length ? body : Arrays.copyOf(body, length);
            }
            String text = new String(body, 0, Math.min(body.length, 300), StandardCharsets.UTF_8);
            if (status >= 500) {
                throw new IOException("HTTP " + status + " from the store: " + text);
            }
            if (status == 404) {
                throw new StoreRefused("remote object missing: " + key);
            }
            throw new StoreRefused("remote object " + key + ": the store refused a GET of bytes " + from + "-"
                    + (from + length - 1) + " (HTTP " + status + "; the plan's signed URLs expire 6 hours after "
                    + "it was made): " + text);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    private byte[] readFile(long from, int length) throws IOException {
        Path path = Path.of(URI.create(url));
        try (FileChannel channel = FileChannel.open(path, StandardOpenOption.READ)) {
            checkSize(channel.size());
            ByteBuffer out = ByteBuffer.allocate(length);
            while (out.hasRemaining()) {
                if (channel.read(out, from + out.position()) < 0) {
                    throw new IOException("remote object " + key + ": the file ended at byte " + out.position());
                }
            }
            return out.array();
        } catch (NoSuchFileException e) {
            throw new StoreRefused("remote object missing: " + key + " (" + path + ")");
        }
    }

    /** The object's size is its manifest's, as the read core checks it: a longer or shorter object is not the copy. */
    private void checkSize(long total) throws StoreRefused {
        if (total != size) {
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

    @Override
    public void close() {
        for (Window w : pending) {
            w.body().cancel(true);
        }
        pending.clear();
    }

    /** An answer that asking again cannot change: a missing object, a URL refused or expired, a wrong size. */
    static final class StoreRefused extends IOException {
        private static final long serialVersionUID = 1L;

        StoreRefused(String message) {
            super(message);
        }
    }
}
