package streamjoin.bench;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.time.Duration;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.StreamJoined;

/**
 * The Kafka Streams side of benchmarks/join_throughput.py: the demo's ad-monetization join
 * (examples/ad_monetization.py) written as a Kafka Streams user writes it. Impressions
 * (--impressions) and clicks (--clicks), keyed by auction id, are inner-joined with
 * KStream.join when their event times are at most 10 minutes apart (grace 30 s), and each
 * attributed click goes to --output as {"auction_id", "impression_id", "click_id",
 * "campaign", "ad_id", "cost_micros", "user"}. JSON values as Jackson trees through a serde,
 * RocksDB window stores with changelogs, default caching, one stream thread, --commit-ms as
 * the commit interval.
 *
 * <p>Progress marks (BENCH_MARKS, BENCH_LAST_OFFSETS) are written by Harness.Marks: every
 * record of both inputs is marked.
 */
public final class AdJoin {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Duration WINDOW = Duration.ofMinutes(10);
    private static final Duration GRACE = Duration.ofSeconds(30);

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = Harness.parse(argv);
        Harness.Marks marks = new Harness.Marks(System.getenv("BENCH_MARKS"), System.getenv("BENCH_LAST_OFFSETS"));

        Serde<JsonNode> json = Serdes.serdeFrom(AdJoin::write, AdJoin::read);
        Consumed<String, JsonNode> consumed = Consumed.with(Serdes.String(), json);
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, JsonNode> impressions = builder.stream(args.get("impressions"), consumed)
                .processValues(() -> new Harness.Mark<>(marks));
        KStream<String, JsonNode> clicks = builder.stream(args.get("clicks"), consumed)
                .processValues(() -> new Harness.Mark<>(marks));
        // The join stores' changelogs keep everything: Kafka Streams gives them retention.ms =
        // window + grace + 1 day, and the broker would delete segments of these old event
        // times as soon as they are written.
        StreamJoined<String, JsonNode, JsonNode> stores = StreamJoined.with(Serdes.String(), json, json)
                .withLoggingEnabled(Map.of("retention.ms", "-1"));
        impressions.join(clicks, AdJoin::attributed, JoinWindows.ofTimeDifferenceAndGrace(WINDOW, GRACE), stores)
                .to(args.get("output"), Produced.with(Serdes.String(), json));

        KafkaStreams streams = new KafkaStreams(builder.build(), Harness.properties(args));
        Harness.runUntilStopped(streams);
    }

    /** An attributed click, exactly as the demo builds it. */
    private static JsonNode attributed(String auctionId, JsonNode impression, JsonNode click) {
        ObjectNode out = JSON.createObjectNode();
        out.put("auction_id", auctionId);
        out.set("impression_id", impression.get("impression_id"));
        out.set("click_id", click.get("click_id"));
        out.set("campaign", impression.get("campaign"));
        out.set("ad_id", impression.get("ad_id"));
        out.set("cost_micros", impression.get("bid_micros"));
        out.set("user", click.get("user"));
        return out;
    }

    private static JsonNode read(String topic, byte[] bytes) {
        if (bytes == null) {
            return null;
        }
        try {
            return JSON.readTree(bytes);
        } catch (IOException e) {
            throw new UncheckedIOException("not JSON in " + topic, e);
        }
    }

    private static byte[] write(String topic, JsonNode node) {
        if (node == null) {
            return null;
        }
        try {
            return JSON.writeValueAsBytes(node);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
