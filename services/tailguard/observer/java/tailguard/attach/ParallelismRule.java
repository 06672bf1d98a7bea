package tailguard.attach;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.apache.spark.MapOutputStatistics;
import org.apache.spark.SparkContext;
import org.apache.spark.network.util.JavaUtils;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.execution.CoalescedPartitionSpec;
import org.apache.spark.sql.execution.ShufflePartitionSpec;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.execution.adaptive.AQEShuffleReadExec;
import org.apache.spark.sql.execution.adaptive.ShuffleQueryStageExec;
import org.apache.spark.sql.internal.SQLConf;
import scala.Option;
import scala.collection.JavaConverters;
import scala.runtime.AbstractFunction1;
import tailguard.observe.TaskEventListener;

/**
 * tailguard's adaptive parallelism for a query stage's shuffle reads (a query-stage optimizer
 * rule: {@code SparkSessionExtensions.injectQueryStageOptimizerRule}, see
 * {@link AttachExtensions}).
 *
 * Spark runs it on each query stage about to be planned, after its own
 * CoalesceShufflePartitions. It acts only where Spark coalesced: a read whose partition specs
 * are contiguous CoalescedPartitionSpecs covering every reducer partition of a shuffle Spark
 * lets a plan re-partition (ENSURE_REQUIREMENTS, REPARTITION_BY_COL, REBALANCE_*). Spark gives
 * the reads it coalesced together (the sides of a join) the same specs, so reads with equal
 * specs are one request, and get one set of ranges. A {@code repartition(n)} (REPARTITION_BY_NUM,
 * never coalesced), skew-join splits (PartialReducerPartitionSpec, and their partner side's
 * repeated ranges, which are not contiguous) and local reads are left alone. The bytes per
 * reducer partition are Spark's MapOutputStatistics; the decider's ranges replace the specs.
 *
 * Nothing here may fail the query: on any error, or without a decision in time, the plan is
 * returned as Spark made it.
 */
public final class ParallelismRule extends Rule<SparkPlan> {
    private static final java.util.Set<String> RESIZABLE = new java.util.HashSet<>(java.util.Arrays.asList(
        "ENSURE_REQUIREMENTS", "REPARTITION_BY_COL", "REBALANCE_PARTITIONS_BY_NONE", "REBALANCE_PARTITIONS_BY_COL"));
    private static volatile boolean warned;

    private final SparkSession session;

    public ParallelismRule(SparkSession session) {
        this.session = session;
    }

    /** One read Spark coalesced: its stage and the shuffle's bytes per reducer partition. */
    private static final class Read {
        final ShuffleQueryStageExec stage;
        final int shuffle;
        final long[] bytes;

        Read(ShuffleQueryStageExec stage, int shuffle, long[] bytes) {
            this.stage = stage;
            this.shuffle = shuffle;
            this.bytes = bytes;
        }
    }

    @Override
    public SparkPlan apply(SparkPlan plan) {
        try {
            Actuator actuator = Actuator.of(session.sparkContext());
            if (actuator == null || !actuator.plansQueryStages()) return plan;
            // A job left out of what is published (its thread's local property): the decider
            // hears nothing of it, so it has nothing to decide.
            if (TaskEventListener.ignored(session.sparkContext().getLocalProperty(TaskEventListener.IGNORE))) {
                return plan;
            }
            Map<String, List<Read>> groups = new LinkedHashMap<>();
            collect(plan, groups);
            if (groups.isEmpty()) return plan;
            Map<Integer, scala.collection.immutable.List<ShufflePartitionSpec>> specs = new HashMap<>();
            for (List<Read> group : groups.values()) {
                decide(actuator, group, specs);
            }
            return specs.isEmpty() ? plan : rewrite(plan, specs);
        } catch (RuntimeException | LinkageError e) {
            if (!warned) {
                warned = true;
                System.err.println("tailguard attach: the query-stage rule kept Spark's plan (" + e + ")");
            }
            return plan;
        }
    }

    private void collect(SparkPlan node, Map<String, List<Read>> groups) {
        if (node instanceof AQEShuffleReadExec) {
            AQEShuffleReadExec read = (AQEShuffleReadExec) node;
            String key = coalescedKey(read);
            if (key != null) {
                ShuffleQueryStageExec stage = (ShuffleQueryStageExec) read.child();
                Option<MapOutputStatistics> stats = stage.mapStats();
                int partitions = stage.shuffle().numPartitions();
                long[] bytes = stats.isDefined() ? stats.get().bytesByPartitionId() : new long[partitions];
                int shuffle = stats.isDefined() ? stats.get().shuffleId() : -1 - stage.id();
                groups.computeIfAbsent(key, k -> new ArrayList<>()).add(new Read(stage, shuffle, bytes));
            }
            return;
        }
        scala.collection.Seq<SparkPlan> children = node.children();
        for (int i = 0; i < children.size(); i++) collect(children.apply(i), groups);
    }

    /** The read's specs as a key if Spark coalesced it and its shuffle may be re-partitioned. */
    private static String coalescedKey(AQEShuffleReadExec read) {
        if (!(read.child() instanceof ShuffleQueryStageExec)) return null;
        ShuffleQueryStageExec stage = (ShuffleQueryStageExec) read.child();
        if (!RESIZABLE.contains(stage.shuffle().shuffleOrigin().toString())) return null;
        int partitions = stage.shuffle().numPartitions();
        scala.collection.Seq<ShufflePartitionSpec> specs = read.partitionSpecs();
        StringBuilder key = new StringBuilder().append(partitions).append(':');
        int next = 0;
        for (int i = 0; i < specs.size(); i++) {
            ShufflePartitionSpec spec = specs.apply(i);
            if (!(spec instanceof CoalescedPartitionSpec)) return null;
            CoalescedPartitionSpec c = (CoalescedPartitionSpec) spec;
            if (c.startReducerIndex() != next || c.endReducerIndex() <= next) return null;
            next = c.endReducerIndex();
            key.append(next).append(',');
        }
        return next == partitions ? key.toString() : null;
    }

    private void decide(Actuator actuator, List<Read> group,
                        Map<Integer, scala.collection.immutable.List<ShufflePartitionSpec>> specs) {
        // A shuffle read twice (a reused exchange) is one input.
        Map<Integer, Read> inputs = new LinkedHashMap<>();
        for (Read r : group) inputs.putIfAbsent(r.shuffle, r);
        int partitions = group.get(0).stage.shuffle().numPartitions();
        int[] shuffles = new int[inputs.size()];
        long[][] bytes = new long[inputs.size()][];
        int i = 0;
        for (Read r : inputs.values()) {
            shuffles[i] = r.shuffle;
            bytes[i++] = r.bytes;
        }
        long total = 0;
        for (long[] b : bytes) for (long x : b) total += x;
        int[] ends = actuator.ranges(shuffles, bytes, partitions, floor(session.sparkContext(), total));
        if (ends == null) return;
        for (Read r : group) {
            List<ShufflePartitionSpec> out = new ArrayList<>(ends.length);
            int start = 0;
            for (int end : ends) {
                long size = 0;
                for (int p = start; p < end; p++) size += r.bytes[p];
                out.add(new CoalescedPartitionSpec(start, end, Option.apply((Object) Long.valueOf(size))));
                start = end;
            }
            specs.put(r.stage.id(), JavaConverters.asScalaBuffer(out).toList());
        }
    }

    /**
     * The fewest ranges Spark's own coalescing would make of `totalBytes` (CoalesceShufflePartitions
     * and ShufflePartitionsUtil.coalescePartitions): the minimum partition number (the user's, else
     * the default parallelism when parallelismFirst) only caps the target size at total / number,
     * and the target never goes below minPartitionSize (1 MiB by default). So a shuffle smaller than
     * number x minPartitionSize gets fewer partitions than that number: a small aggregation one.
     * Taking the number itself as the floor forced a tiny groupBy into one task per core, each
     * writing its own file (seen in make bench-attach: 6 reducers of a few KB where Spark ran 1).
     */
    private static int floor(SparkContext sc, long totalBytes) {
        SQLConf conf = SQLConf.get();
        // Read only if set: SQLConf validates a default given here against the entry's type.
        String minKey = "spark.sql.adaptive.coalescePartitions.minPartitionNum";
        int number;
        if (conf.contains(minKey)) {
            number = Integer.parseInt(conf.getConfString(minKey).trim());
        } else {
            String firstKey = "spark.sql.adaptive.coalescePartitions.parallelismFirst";
            boolean parallelismFirst = !conf.contains(firstKey)
                || Boolean.parseBoolean(conf.getConfString(firstKey).trim());
            number = parallelismFirst ? sc.defaultParallelism() : 1;
        }
        String sizeKey = "spark.sql.adaptive.coalescePartitions.minPartitionSize";
        long minSize = Math.max(1L, conf.contains(sizeKey)
            ? JavaUtils.byteStringAsBytes(conf.getConfString(sizeKey).trim())
            : 1L << 20);
        long bySize = Math.max(1L, (totalBytes + minSize - 1) / minSize);
        return (int) Math.min(number, bySize);  // the relay clamps to [1, partitions]
    }

    private SparkPlan rewrite(SparkPlan node, Map<Integer, scala.collection.immutable.List<ShufflePartitionSpec>> specs) {
        if (node instanceof AQEShuffleReadExec) {
            AQEShuffleReadExec read = (AQEShuffleReadExec) node;
            if (read.child() instanceof ShuffleQueryStageExec) {
                scala.collection.immutable.List<ShufflePartitionSpec> s = specs.get(((ShuffleQueryStageExec) read.child()).id());
                if (s != null) return new AQEShuffleReadExec(read.child(), s);
            }
            return node;
        }
        if (node.children().isEmpty()) return node;
        return node.mapChildren(new AbstractFunction1<SparkPlan, SparkPlan>() {
            @Override
            public SparkPlan apply(SparkPlan child) {
                return rewrite(child, specs);
            }
        });
    }
}
