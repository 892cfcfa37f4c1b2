package streamjoin.bench;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.io.Writer;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.time.Instant;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.EmitStrategy;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;
import org.apache.kafka.streams.processor.api.RecordMetadata;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlySessionStore;
import org.apache.kafka.streams.state.ReadOnlyWindowStore;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.state.WindowStore;

/**
 * The Kafka Streams side of benchmarks/window_kinds.py: a hopping-window or session-window
 * count per key, written as a Kafka Streams user writes it (DSL, RocksDB stores with
 * changelogs, default caching and commit interval, one stream thread).
 *
 * <p>--emit update: the count's KTable is the result; once the last offset of every input
 * partition has been processed, its windows are read through interactive queries and written
 * as the dump "[key, start, count]" (hopping) or "[key, start, end, count]" (sessions).
 * --emit close: EmitStrategy.onWindowClose(); each final result goes to --output as
 * key = the user key, value = {"start":..,"end":..,"count":..}.
 *
 * <p>Progress marks (BENCH_MARKS, BENCH_LAST_OFFSETS) are written in the format of
 * benchmarks/progress_marks.py, with the process CPU time of all threads.
 */
public final class WindowKinds {
    private static final String STORE = "counts";

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = parse(argv);
        String window = args.get("window");
        boolean close = "close".equals(args.get("emit"));
        long sizeMs = Long.parseLong(args.getOrDefault("size-ms", "0"));
        long stepMs = Long.parseLong(args.getOrDefault("step-ms", "0"));
        long gapMs = Long.parseLong(args.getOrDefault("gap-ms", "0"));
        long graceMs = Long.parseLong(args.get("grace-ms"));
        long retentionMs = Long.parseLong(args.get("retention-ms"));
        Marks marks = new Marks(System.getenv("BENCH_MARKS"), System.getenv("BENCH_LAST_OFFSETS"));

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args.get("app-id"));
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args.get("bootstrap"));
        props.put(StreamsConfig.STATE_DIR_CONFIG, args.get("state-dir"));
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");

        // The window changelogs keep everything: Kafka Streams gives them retention.ms =
        // store retention + 1 day, and the broker would delete segments of these old event
        // times as soon as they are written.
        Map<String, String> changelog = Map.of("retention.ms", "-1");
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, String> events = builder
                .stream(args.get("input"), Consumed.with(Serdes.String(), Serdes.String()))
                .processValues(() -> new Mark<>(marks));
        KTable<Windowed<String>, Long> counts;
        if ("hopping".equals(window)) {
            TimeWindows windows = TimeWindows.ofSizeAndGrace(Duration.ofMillis(sizeMs), Duration.ofMillis(graceMs))
                    .advanceBy(Duration.ofMillis(stepMs));
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
            throw new IllegalArgumentException("--window must be hopping or session, not " + window);
        }
        if (close) {
            counts.toStream()
                    .filter((key, n) -> n != null) // (a merged-away session's tombstone)
                    .map((key, n) -> KeyValue.pair(key.key(), "{\"start\":" + key.window().start()
                            + ",\"end\":" + key.window().end() + ",\"count\":" + n + "}"))
                    .to(args.get("output"), Produced.with(Serdes.String(), Serdes.String()));
        }

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(10));
            stopped.countDown();
        }));
        if (!close) {
            String dumpPath = System.getenv("BENCH_MARKS") + ".dump.all";
            int keys = Integer.parseInt(args.getOrDefault("keys", "0"));
            long fromMs = Long.parseLong(args.get("from-ms"));
            long toMs = Long.parseLong(args.get("to-ms"));
            marks.onDone = () -> new Thread(() -> dump(streams, window, dumpPath, keys, fromMs, toMs)).start();
        }
        streams.start();
        stopped.await();
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
                if ("hopping".equals(window)) {
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

    private static Map<String, String> parse(String[] argv) {
        Map<String, String> out = new HashMap<>();
        for (int i = 0; i + 1 < argv.length; i += 2) {
            if (!argv[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --name value, got " + argv[i]);
            }
            out.put(argv[i].substring(2), argv[i + 1]);
        }
        return out;
    }

    /** Marks each input record as seen (its topic, partition and offset), then passes it on. */
    private static final class Mark<V> implements FixedKeyProcessor<String, V, V> {
        private final Marks marks;
        private FixedKeyProcessorContext<String, V> context;

        Mark(Marks marks) {
            this.marks = marks;
        }

        @Override
        public void init(FixedKeyProcessorContext<String, V> context) {
            this.context = context;
        }

        @Override
        public void process(FixedKeyRecord<String, V> record) {
            RecordMetadata meta = context.recordMetadata().orElseThrow();
            marks.seen(meta.topic(), meta.partition(), meta.offset());
            context.forward(record);
        }
    }

    /** FIRST / PDONE / DONE lines: "WHAT unix-seconds process-cpu-seconds [topic:partition]". */
    static final class Marks {
        private final Path path;
        private final Map<String, Long> last = new HashMap<>();
        private final Set<String> pending = new HashSet<>();
        private final com.sun.management.OperatingSystemMXBean os =
                (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        private boolean started;
        Runnable onDone;

        Marks(String path, String lastOffsets) {
            this.path = Path.of(path);
            for (String item : lastOffsets.split(",")) {
                if (item.isEmpty()) {
                    continue;
                }
                int cut = item.lastIndexOf(':');
                last.put(item.substring(0, cut), Long.parseLong(item.substring(cut + 1)));
            }
            pending.addAll(last.keySet());
        }

        void seen(String topic, int partition, long offset) {
            if (!started) {
                started = true;
                write("FIRST", "");
            }
            String tp = topic + ":" + partition;
            Long lastOffset = last.get(tp);
            if (lastOffset != null && lastOffset == offset) {
                write("PDONE", tp);
                pending.remove(tp);
                if (pending.isEmpty()) {
                    write("DONE", "");
                    if (onDone != null) {
                        onDone.run();
                    }
                }
            }
        }

        private void write(String what, String extra) {
            double now = System.currentTimeMillis() / 1000.0;
            double cpu = os.getProcessCpuTime() / 1e9;
            String line = String.format("%s %.6f %.6f %s", what, now, cpu, extra).strip() + "\n";
            try {
                Files.writeString(path, line, StandardOpenOption.CREATE, StandardOpenOption.APPEND);
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
    }
}
