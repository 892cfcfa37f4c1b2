package streamjoin.bench;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.time.Duration;
import java.time.Instant;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.EmitStrategy;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlySessionStore;
import org.apache.kafka.streams.state.ReadOnlyWindowStore;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.state.WindowStore;

/**
 * The Kafka Streams side of benchmarks/window_kinds.py (hopping and session windows) and
 * benchmarks/window_count.py (tumbling windows): a windowed count per key, written as a Kafka
 * Streams user writes it (DSL, RocksDB stores with changelogs, default caching, one stream
 * thread; the default commit interval unless --commit-ms says otherwise).
 *
 * <p>--emit update: the count's KTable is the result; once the last offset of every input
 * partition has been processed, its windows are read through interactive queries and written
 * as the dump "[key, start, count]" (tumbling, hopping) or "[key, start, end, count]"
 * (sessions).
 * --emit close: EmitStrategy.onWindowClose(); each final result goes to --output as
 * key = the user key, value = {"start":..,"end":..,"count":..}.
 *
 * <p>Progress marks (BENCH_MARKS, BENCH_LAST_OFFSETS) are written by Harness.Marks.
 */
public final class WindowKinds {
    private static final String STORE = "counts";

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = Harness.parse(argv);
        String window = args.get("window");
        boolean close = "close".equals(args.get("emit"));
        long sizeMs = Long.parseLong(args.getOrDefault("size-ms", "0"));
        long stepMs = Long.parseLong(args.getOrDefault("step-ms", "0"));
        long gapMs = Long.parseLong(args.getOrDefault("gap-ms", "0"));
        long graceMs = Long.parseLong(args.get("grace-ms"));
        long retentionMs = Long.parseLong(args.get("retention-ms"));
        Harness.Marks marks = new Harness.Marks(System.getenv("BENCH_MARKS"), System.getenv("BENCH_LAST_OFFSETS"));

        Properties props = Harness.properties(args);

        // The window changelogs keep everything: Kafka Streams gives them retention.ms =
        // store retention + 1 day, and the broker would delete segments of these old event
        // times as soon as they are written.
        Map<String, String> changelog = Map.of("retention.ms", "-1");
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, String> events = builder
                .stream(args.get("input"), Consumed.with(Serdes.String(), Serdes.String()))
                .processValues(() -> new Harness.Mark<>(marks));
        KTable<Windowed<String>, Long> counts;
        if ("tumbling".equals(window) || "hopping".equals(window)) {
            TimeWindows windows = TimeWindows.ofSizeAndGrace(Duration.ofMillis(sizeMs), Duration.ofMillis(graceMs));
            if ("hopping".equals(window)) {
                windows = windows.advanceBy(Duration.ofMillis(stepMs));
            }
            var windowed = events.groupByKey().windowedBy(windows);
            if (close) {
                windowed = windowed.emitStrategy(EmitStrategy.onWindowClose());
            }
            counts = windowed.count(Materialized.<String, Long, WindowStore<Bytes, byte[]>>as(STORE)
                    .withRetention(Duration.ofMillis(retentionMs))
                    .withLoggingEnabled(changelog));
        } else if ("session".equals(window)) {
            SessionWindows windows = SessionWindows.ofInactivityGapAndGrace(Duration.ofMillis(gapMs), Duration.ofMillis(graceMs));
            var windowed = events.groupByKey().windowedBy(windows);
            if (close) {
                windowed = windowed.emitStrategy(EmitStrategy.onWindowClose());
            }
            counts = windowed.count(Materialized.<String, Long, SessionStore<Bytes, byte[]>>as(STORE)
                    .withRetention(Duration.ofMillis(retentionMs))
                    .withLoggingEnabled(changelog));
        } else {
            throw new IllegalArgumentException("--window must be tumbling, hopping or session, not " + window);
        }
        if (close) {
            counts.toStream()
                    .filter((key, n) -> n != null) // (a merged-away session's tombstone)
                    .map((key, n) -> KeyValue.pair(key.key(), "{\"start\":" + key.window().start()
                            + ",\"end\":" + key.window().end() + ",\"count\":" + n + "}"))
                    .to(args.get("output"), Produced.with(Serdes.String(), Serdes.String()));
        }

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        if (!close) {
            String dumpPath = System.getenv("BENCH_MARKS") + ".dump.all";
            int keys = Integer.parseInt(args.getOrDefault("keys", "0"));
            long fromMs = Long.parseLong(args.get("from-ms"));
            long toMs = Long.parseLong(args.get("to-ms"));
            marks.onDone = () -> new Thread(() -> dump(streams, window, dumpPath, keys, fromMs, toMs)).start();
        }
        Harness.runUntilStopped(streams);
    }

    /**
     * Every window of the store, read through interactive queries once processing is done
     * (windows and sessions within [fromMs, toMs]: the caching store walks a full time range
     * segment by segment).
     */
    private static void dump(KafkaStreams streams, String window, String path, int keys, long fromMs, long toMs) {
        try {
            Thread.sleep(500); // the stream thread finishes the record whose mark said DONE
            Path tmp = Path.of(path + ".tmp-java");
            try (Writer out = Files.newBufferedWriter(tmp, StandardCharsets.UTF_8)) {
                if (!"session".equals(window)) {
                    ReadOnlyWindowStore<String, Long> store = streams.store(
                            StoreQueryParameters.fromNameAndType(STORE, QueryableStoreTypes.windowStore()));
                    try (KeyValueIterator<Windowed<String>, Long> it =
                                 store.fetchAll(Instant.ofEpochMilli(fromMs), Instant.ofEpochMilli(toMs))) {
                        while (it.hasNext()) {
                            KeyValue<Windowed<String>, Long> kv = it.next();
                            out.write("[\"" + kv.key.key() + "\"," + kv.key.window().start() + "," + kv.value + "]\n");
                        }
                    }
                } else {
                    ReadOnlySessionStore<String, Long> store = streams.store(
                            StoreQueryParameters.fromNameAndType(STORE, QueryableStoreTypes.sessionStore()));
                    for (int k = 0; k < keys; k++) {
                        try (KeyValueIterator<Windowed<String>, Long> it = store.findSessions(String.format("user-%05d", k), fromMs, toMs)) {
                            while (it.hasNext()) {
                                KeyValue<Windowed<String>, Long> kv = it.next();
                                out.write("[\"" + kv.key.key() + "\"," + kv.key.window().start() + ","
                                        + kv.key.window().end() + "," + kv.value + "]\n");
                            }
                        }
                    }
                }
            }
            Files.move(tmp, Path.of(path), StandardCopyOption.ATOMIC_MOVE);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
