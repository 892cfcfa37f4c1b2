package streamjoin.bench;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;

import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;
import org.apache.kafka.streams.processor.api.RecordMetadata;

/**
 * What the Kafka Streams benchmark apps share: their command line ("--name value" pairs, as
 * benchmarks/harness.py passes them), their configuration, running until the harness stops
 * them, and their progress marks (the format of benchmarks/progress_marks.py).
 */
final class Harness {
    private Harness() {
    }

    /** "--name value" pairs -> name -> value. */
    static Map<String, String> parse(String[] argv) {
        Map<String, String> out = new HashMap<>();
        for (int i = 0; i + 1 < argv.length; i += 2) {
            if (!argv[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --name value, got " + argv[i]);
            }
            out.put(argv[i].substring(2), argv[i + 1]);
        }
        return out;
    }

    /**
     * The configuration every app starts from: --app-id, --bootstrap, --state-dir, string
     * keys and values, reading each topic from its start; --commit-ms, when given, as the
     * commit interval (else Kafka Streams' default, 30 s at-least-once: with it the caches
     * hold results back for that long, where the streamjoin apps commit every second).
     */
    static Properties properties(Map<String, String> args) {
        Properties props = new Properties();
        if (args.containsKey("commit-ms")) {
            props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, args.get("commit-ms"));
        }
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args.get("app-id"));
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args.get("bootstrap"));
        props.put(StreamsConfig.STATE_DIR_CONFIG, args.get("state-dir"));
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        return props;
    }

    /** Starts the app and waits until the harness stops the process (SIGTERM: a clean close). */
    static void runUntilStopped(KafkaStreams streams) throws InterruptedException {
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(10));
            stopped.countDown();
        }));
        streams.start();
        stopped.await();
    }

    /** Marks each record as seen (its topic, partition and offset), then passes it on. */
    static final class Mark<V> implements FixedKeyProcessor<String, V, V> {
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

    /**
     * FIRST / PDONE / DONE lines: "WHAT unix-seconds process-cpu-seconds [topic:partition]",
     * with the process CPU time of all threads. Synchronized: an app may mark records from
     * more than one thread.
     */
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

        synchronized void seen(String topic, int partition, long offset) {
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
