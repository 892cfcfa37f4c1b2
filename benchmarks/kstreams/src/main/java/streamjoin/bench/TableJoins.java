package streamjoin.bench;

import java.util.Map;
import java.util.Properties;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.GlobalKTable;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * The Kafka Streams side of benchmarks/table_joins.py and benchmarks/enrichment.py, written as
 * a Kafka Streams user writes it (DSL, RocksDB stores, default caching, one stream thread,
 * --commit-ms as the commit interval), JSON values parsed with Jackson:
 *
 * <ul>
 *   <li>--workload enrich: the rows of --table in a KTable (co-partitioned with the events);
 *   each event of --input is left-joined with the row of its key and sent to --output as
 *   {"event_id", "amount", "tier", "country"}.
 *   <li>--workload global: the rows of --table in a GlobalKTable (every instance holds all of
 *   them); each event of --input is left-joined with the row of its "user" field and sent to
 *   --output as {"event_id", "amount", "tier", "country"}.
 *   <li>--workload fk: orders (--input, a KTable keyed by order id) inner-joined with
 *   customers (--table, a KTable) by the order's "customer" field (KIP-213's foreign-key
 *   join); every change of the result goes to --output as {"order", "amount", "customer",
 *   "name", "country"} (a tombstone when a row leaves it).
 * </ul>
 *
 * <p>Progress marks (BENCH_MARKS, BENCH_LAST_OFFSETS) are written by Harness.Marks: every
 * record of --input is marked (and, enrich and fk, every record of --table: the work of a
 * run starts with the first table row, as in the streamjoin apps).
 */
public final class TableJoins {
    private static final ObjectMapper JSON = new ObjectMapper();

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = Harness.parse(argv);
        String workload = args.get("workload");
        Harness.Marks marks = new Harness.Marks(
                System.getenv("BENCH_MARKS"), System.getenv("BENCH_LAST_OFFSETS"));

        Properties props = Harness.properties(args);

        StreamsBuilder builder = new StreamsBuilder();
        Consumed<String, String> strings = Consumed.with(Serdes.String(), Serdes.String());
        Produced<String, String> out = Produced.with(Serdes.String(), Serdes.String());
        if ("enrich".equals(workload)) {
            KTable<String, String> users = builder.stream(args.get("table"), strings)
                    .processValues(() -> new Harness.Mark<>(marks))
                    .toTable(Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("users"));
            builder.stream(args.get("input"), strings)
                    .processValues(() -> new Harness.Mark<>(marks))
                    .leftJoin(users, TableJoins::enrich)
                    .to(args.get("output"), out);
        } else if ("global".equals(workload)) {
            GlobalKTable<String, String> users = builder.globalTable(args.get("table"), strings,
                    Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("users"));
            KStream<String, String> events = builder.stream(args.get("input"), strings)
                    .processValues(() -> new Harness.Mark<>(marks));
            events.leftJoin(users, (key, event) -> field(event, "user"), TableJoins::enrich)
                    .to(args.get("output"), out);
        } else if ("fk".equals(workload)) {
            KTable<String, String> orders = builder.stream(args.get("input"), strings)
                    .processValues(() -> new Harness.Mark<>(marks))
                    .toTable(Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("orders"));
            KTable<String, String> customers = builder.stream(args.get("table"), strings)
                    .processValues(() -> new Harness.Mark<>(marks))
                    .toTable(Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("customers"));
            orders.join(customers, order -> field(order, "customer"), TableJoins::orderWithCustomer)
                    .toStream()
                    .to(args.get("output"), out);
        } else {
            throw new IllegalArgumentException("--workload must be enrich, global or fk, not " + workload);
        }

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        Harness.runUntilStopped(streams);
    }

    private static JsonNode tree(String json) {
        try {
            return JSON.readTree(json);
        } catch (java.io.IOException e) {
            throw new IllegalArgumentException("not JSON: " + json, e);
        }
    }

    private static String field(String json, String name) {
        JsonNode node = tree(json).get(name);
        return node == null || node.isNull() ? null : node.asText();
    }

    private static String write(ObjectNode node) {
        try {
            return JSON.writeValueAsString(node);
        } catch (java.io.IOException e) {
            throw new IllegalStateException(e);
        }
    }

    private static String enrich(String event, String row) {
        JsonNode e = tree(event);
        ObjectNode outValue = JSON.createObjectNode();
        outValue.set("event_id", e.get("event_id"));
        outValue.set("amount", e.get("amount"));
        if (row == null) {
            outValue.putNull("tier");
            outValue.putNull("country");
        } else {
            JsonNode r = tree(row);
            outValue.set("tier", r.get("tier"));
            outValue.set("country", r.get("country"));
        }
        return write(outValue);
    }

    private static String orderWithCustomer(String order, String customer) {
        JsonNode o = tree(order);
        JsonNode c = tree(customer);
        ObjectNode outValue = JSON.createObjectNode();
        outValue.set("order", o.get("order"));
        outValue.set("amount", o.get("amount"));
        outValue.set("customer", o.get("customer"));
        outValue.set("name", c.get("name"));
        outValue.set("country", c.get("country"));
        return write(outValue);
    }
}
