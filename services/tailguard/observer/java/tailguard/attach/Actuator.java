package tailguard.attach;

import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.WeakHashMap;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.scheduler.DAGScheduler;
import org.apache.spark.scheduler.HealthTracker;
import org.apache.spark.scheduler.SchedulerBackend;
import org.apache.spark.scheduler.SparkListenerNodeExcluded;
import org.apache.spark.scheduler.SparkListenerNodeUnexcluded;
import org.apache.spark.scheduler.Task;
import org.apache.spark.scheduler.TaskScheduler;
import org.apache.spark.scheduler.TaskSchedulerImpl;
import org.apache.spark.scheduler.TaskSetManager;
import org.apache.spark.util.SystemClock;
import scala.Option;
import scala.collection.JavaConverters;

/**
 * Applies tailguard's commands inside a running Spark application's own scheduler.
 *
 * The relay (Python) has already checked each command's signature, its sender's authority and
 * that its id is new, and translated it into Spark's coordinates; what arrives here is one
 * action line (see {@link #handle}). Each action is applied under the lock Spark itself takes
 * for scheduling (TaskSchedulerImpl's monitor: its methods are `synchronized`), and the
 * scheduler is woken ({@code reviveOffers}) only after the lock is released, as Spark's own
 * speculation does. The answer is "OK" or "NO" with the reason, which the relay publishes as
 * CommandApplied or CommandRejected.
 *
 * The members used are Scala {@code private[spark]}/{@code private[scheduler]} ones, public in
 * the bytecode and without any compatibility promise (design section 8): {@link #probe} checks
 * each kind's members once, by reflection, and a kind whose members this Spark build lacks is
 * refused with that reason; a call that still fails to link is caught. Nothing here may fail,
 * hang or slow the application: every action is a few field updates under the lock.
 */
public final class Actuator {
    public static final String SPECULATE = "LaunchSpeculativeAttempts";
    public static final String BLOCK = "BlockNodes";
    public static final String RESTART = "RestartTasks";
    public static final String FAIL = "FailJob";
    public static final String PARALLELISM = "SetParallelism";
    public static final String EXTENSIONS_CLASS = "tailguard.attach.AttachExtensions";

    /** Where the actuator writes lines to the relay (the listener's pipe). */
    public interface Channel {
        void send(Object... fields);
    }

    // The actuator of each live SparkContext: the query-stage rule, which Spark builds per
    // session, finds it here.
    private static final Map<SparkContext, Actuator> ACTIVE = Collections.synchronizedMap(new WeakHashMap<>());

    /** The actuator attached to `sc`, or null. */
    public static Actuator of(SparkContext sc) {
        return ACTIVE.get(sc);
    }

    // Spark's own failure-based exclusion, kept out of reach when tailguard installs the
    // HealthTracker (the user did not ask for it): per task, per stage and per application.
    private static final String[] FAILURE_EXCLUSION_KEYS = {
        "spark.excludeOnFailure.task.maxTaskAttemptsPerExecutor",
        "spark.excludeOnFailure.task.maxTaskAttemptsPerNode",
        "spark.excludeOnFailure.stage.maxFailedTasksPerExecutor",
        "spark.excludeOnFailure.stage.maxFailedExecutorsPerNode",
        "spark.excludeOnFailure.application.maxFailedTasksPerExecutor",
        "spark.excludeOnFailure.application.maxFailedExecutorsPerNode",
    };

    private final SparkContext sc;
    private final Map<String, String> missing = new LinkedHashMap<>();
    private boolean probed;
    private HealthTracker tracker;
    private boolean trackerInstalled;
    // Made when the relay says it acts, with its decision timeout (tailguard.attach.decision-timeout).
    private volatile QueryStagePlanner planner;
    private volatile Channel channel;

    public Actuator(SparkContext sc) {
        this.sc = sc;
        ACTIVE.put(sc, this);
    }

    /** The listener's pipe to the relay, and that the relay acts on the services' commands. */
    public void connect(Channel channel) {
        this.channel = channel;
    }

    /** The relay acts on the services' commands; a query stage waits `decisionTimeoutMs` for ranges. */
    public void relayActs(long decisionTimeoutMs) {
        if (planner == null) planner = new QueryStagePlanner(decisionTimeoutMs);
    }

    /** Whether the query-stage rule should ask for ranges: a relay that acts, and the kind on. */
    public boolean plansQueryStages() {
        return planner != null && channel != null && !probe().containsKey(PARALLELISM);
    }

    /** Reducer ranges for a query stage's reads (see {@link QueryStagePlanner#ranges}), or null. */
    public int[] ranges(int[] shuffles, long[][] bytes, int partitions, int floor) {
        Channel out = channel;
        QueryStagePlanner plans = planner;
        return out == null || plans == null ? null : plans.ranges(out, shuffles, bytes, partitions, floor);
    }

    // ------------------------------------------------------------------ members

    /** Each command kind this Spark build cannot apply, with the reason ("" when all can). */
    public synchronized Map<String, String> probe() {
        if (probed) return missing;
        probed = true;
        check(SPECULATE, TaskSchedulerImpl.class, "taskSetManagerForAttempt", int.class, int.class);
        check(SPECULATE, TaskSetManager.class, "isZombie");
        check(SPECULATE, TaskSetManager.class, "isBarrier");
        check(SPECULATE, TaskSetManager.class, "successful");
        check(SPECULATE, TaskSetManager.class, "copiesRunning");
        check(SPECULATE, TaskSetManager.class, "speculatableTasks");
        check(SPECULATE, TaskSetManager.class, "tasks");
        check(SPECULATE, TaskSetManager.class, "taskAttempts");
        check(SPECULATE, TaskSetManager.class, "addPendingTask", int.class, boolean.class, boolean.class);
        check(SPECULATE, DAGScheduler.class, "speculativeTaskSubmitted", Task.class, int.class);
        check(SPECULATE, TaskSchedulerImpl.class, "backend");
        check(SPECULATE, TaskSchedulerImpl.class, "dagScheduler");
        check(BLOCK, TaskSchedulerImpl.class, "healthTrackerOpt");
        check(BLOCK, TaskSchedulerImpl.class, "hostToExecutors");
        check(BLOCK, HealthTracker.class, "nodeIdToExcludedExpiryTime");
        check(BLOCK, HealthTracker.class, "nextExpiryTime_$eq", long.class);
        checkField(BLOCK, TaskSchedulerImpl.class, "healthTrackerOpt");
        checkField(BLOCK, HealthTracker.class, "_excludedNodeList");
        check(RESTART, SparkContext.class, "killTaskAttempt", long.class, boolean.class, String.class);
        check(FAIL, SparkContext.class, "cancelJob", int.class, String.class);
        String extensions = sc.conf().get("spark.sql.extensions", "");
        if (!java.util.Arrays.asList(extensions.split(",")).stream().anyMatch(e -> e.trim().equals(EXTENSIONS_CLASS))) {
            missing.putIfAbsent(PARALLELISM, "the query-stage rule is not registered: spark.sql.extensions lacks "
                                + EXTENSIONS_CLASS + " (tailguard.spark_conf() sets it), so Spark's adaptive "
                                + "parallelism is left as it is");
        } else if (!sc.conf().getBoolean("spark.sql.adaptive.enabled", true)) {
            missing.putIfAbsent(PARALLELISM, "adaptive query execution is off (spark.sql.adaptive.enabled=false)");
        }
        try {
            Class.forName("org.apache.spark.sql.execution.adaptive.AQEShuffleReadExec");
            Class.forName("org.apache.spark.sql.execution.CoalescedPartitionSpec")
                .getConstructor(int.class, int.class, Option.class);
        } catch (ReflectiveOperationException | LinkageError e) {
            missing.putIfAbsent(PARALLELISM, "this Spark build lacks " + e.getMessage());
        }
        return missing;
    }

    private void check(String kind, Class<?> owner, String name, Class<?>... types) {
        try {
            owner.getMethod(name, types);
        } catch (NoSuchMethodException | LinkageError e) {
            missing.putIfAbsent(kind, "this Spark build lacks " + owner.getSimpleName() + "." + name);
        }
    }

    private void checkField(String kind, Class<?> owner, String name) {
        try {
            owner.getDeclaredField(name);
        } catch (NoSuchFieldException | LinkageError e) {
            missing.putIfAbsent(kind, "this Spark build lacks the field " + owner.getSimpleName() + "." + name);
        }
    }

    // ------------------------------------------------------------------ actions

    /**
     * One action line from the relay, as fields: {@code SPEC id stage stageAttempt index},
     * {@code BLOCK id untilMs host[,host]}, {@code UNBLOCK id host[,host]},
     * {@code KILL id reason taskId[,taskId]}, {@code CANCEL id sparkJobId reason},
     * {@code RANGES id request end[,end]} (a waiting query stage's reducer ranges).
     * Returns {"OK"} or {"NO", reason}.
     */
    public String[] handle(String[] f) {
        String kind = kindOf(f[0]);
        if (kind == null) return no("unknown action " + f[0]);
        String lacking = probe().get(kind);
        if (lacking != null) return no(lacking);
        try {
            switch (f[0]) {
                case "SPEC":
                    return speculate(Integer.parseInt(f[2]), Integer.parseInt(f[3]), Integer.parseInt(f[4]));
                case "BLOCK":
                    return block(split(f[3]), Long.parseLong(f[2]));
                case "UNBLOCK":
                    return unblock(split(f[2]));
                case "KILL":
                    return kill(split(f[3]), f[2]);
                case "RANGES":
                    QueryStagePlanner plans = planner;
                    return plans == null ? no("no query stage plan was requested") : plans.answer(f[2], f[3]);
                default:
                    sc.cancelJob(Integer.parseInt(f[2]), f[3]);
                    return ok();
            }
        } catch (LinkageError | ReflectiveOperationException | RuntimeException e) {
            // A member that changed shape under the same name: refuse, never fail the app.
            return no("Spark refused it: " + e);
        }
    }

    private static String kindOf(String action) {
        switch (action) {
            case "SPEC": return SPECULATE;
            case "BLOCK":
            case "UNBLOCK": return BLOCK;
            case "KILL": return RESTART;
            case "CANCEL": return FAIL;
            case "RANGES": return PARALLELISM;
            default: return null;
        }
    }

    private TaskSchedulerImpl scheduler() {
        TaskScheduler ts = sc.taskScheduler();
        if (!(ts instanceof TaskSchedulerImpl)) {
            throw new IllegalStateException("the task scheduler is " + (ts == null ? "not started" : ts.getClass().getName()));
        }
        return (TaskSchedulerImpl) ts;
    }

    private String[] speculate(int stage, int stageAttempt, int index) {
        TaskSchedulerImpl ts = scheduler();
        synchronized (ts) {
            Option<TaskSetManager> found = ts.taskSetManagerForAttempt(stage, stageAttempt);
            if (found.isEmpty()) return no("stage " + stage + " attempt " + stageAttempt + " has no running task set");
            TaskSetManager tsm = found.get();
            if (tsm.isZombie()) return no("stage " + stage + " attempt " + stageAttempt + " is finished");
            if (tsm.isBarrier()) return no("stage " + stage + " is a barrier stage: its tasks run together or not at all");
            if (index < 0 || index >= tsm.numTasks()) return no("stage " + stage + " has no task " + index);
            if (tsm.successful()[index]) return no("task " + index + " of stage " + stage + " already finished");
            int running = tsm.copiesRunning()[index];
            if (running != 1) {
                return no("task " + index + " of stage " + stage + " has " + running
                          + " copies running; Spark starts a copy only while exactly one runs");
            }
            if (tsm.speculatableTasks().contains(index)) {
                return no("task " + index + " of stage " + stage + " already has a copy waiting");
            }
            Set<String> tried = new HashSet<>();
            for (Object info : JavaConverters.seqAsJavaList(tsm.taskAttempts()[index])) {
                tried.add(((org.apache.spark.scheduler.TaskInfo) info).host());
            }
            Set<String> usable = usableHosts(ts);
            usable.removeAll(tried);
            if (usable.isEmpty()) {
                return no("no other usable host: Spark never runs a copy where the task already ran (tried "
                          + tried + ")");
            }
            tsm.addPendingTask(index, true, true);
            tsm.speculatableTasks().add(index);
            ts.dagScheduler().speculativeTaskSubmitted(tsm.tasks()[index], index);
        }
        revive(ts);
        return ok();
    }

    private String[] block(List<String> hosts, long untilMs) throws ReflectiveOperationException {
        TaskSchedulerImpl ts = scheduler();
        synchronized (ts) {
            HealthTracker ht = tracker(ts);
            Set<String> usable = usableHosts(ts);
            usable.removeAll(hosts);
            if (usable.isEmpty()) {
                // Spark aborts a stage none of whose hosts may run it, after
                // spark.scheduler.excludeOnFailure.unschedulableTaskSetTimeout.
                return no("it would block the last usable hosts " + hosts);
            }
            long now = System.currentTimeMillis();
            for (String host : hosts) {
                ht.nodeIdToExcludedExpiryTime().put(host, untilMs);
                sc.listenerBus().post(new SparkListenerNodeExcluded(now, host, 0));
            }
            refresh(ht);
        }
        return ok();
    }

    private String[] unblock(List<String> hosts) throws ReflectiveOperationException {
        TaskSchedulerImpl ts = scheduler();
        synchronized (ts) {
            HealthTracker ht = tracker(ts);
            long now = System.currentTimeMillis();
            for (String host : hosts) {
                if (ht.nodeIdToExcludedExpiryTime().remove(host).isDefined()) {
                    sc.listenerBus().post(new SparkListenerNodeUnexcluded(now, host));
                }
            }
            refresh(ht);
        }
        revive(ts);
        return ok();
    }

    private String[] kill(List<String> taskIds, String reason) {
        int killed = 0;
        for (String id : taskIds) {
            // Public API; Spark takes its own locks. A killed task is re-run and does not count
            // as a failure.
            if (sc.killTaskAttempt(Long.parseLong(id), true, reason)) killed++;
        }
        if (killed == 0) return no("none of the tasks " + taskIds + " was still running");
        return ok();
    }

    // ------------------------------------------------------------------ the exclusion list

    /** Hosts with a live executor and not excluded: where new tasks can still go. */
    private Set<String> usableHosts(TaskSchedulerImpl ts) {
        Set<String> hosts = new HashSet<>(JavaConverters.setAsJavaSet(ts.hostToExecutors().keySet()));
        Option<HealthTracker> ht = ts.healthTrackerOpt();
        if (ht.isDefined()) hosts.removeAll(JavaConverters.setAsJavaSet(ht.get().excludedNodeList()));
        return hosts;
    }

    /**
     * The application's HealthTracker: the user's, if they turned on Spark's exclusion; else one
     * tailguard installs (under the scheduler's lock) with Spark's failure-based exclusion out of
     * reach, so only tailguard's blocks exclude a host.
     */
    private HealthTracker tracker(TaskSchedulerImpl ts) throws ReflectiveOperationException {
        if (tracker != null) return tracker;
        Option<HealthTracker> existing = ts.healthTrackerOpt();  // computes the lazy value
        if (existing.isDefined()) {
            tracker = existing.get();
            return tracker;
        }
        SparkConf live = sc.conf();
        for (String key : FAILURE_EXCLUSION_KEYS) {
            // Task sets made from now on read these from the application's conf.
            if (!live.contains(key)) live.set(key, String.valueOf(Integer.MAX_VALUE));
        }
        // The tracker's own copy: it validates that per-node attempts stay below
        // spark.task.maxFailures, which a tracker that never excludes on failure need not.
        SparkConf own = live.clone();
        own.set("spark.task.maxFailures", String.valueOf(Integer.MAX_VALUE));
        own.set("spark.excludeOnFailure.task.maxTaskAttemptsPerNode", String.valueOf(Integer.MAX_VALUE - 1));
        HealthTracker created = new HealthTracker(sc.listenerBus(), own, Option.empty(), new SystemClock());
        Field field = TaskSchedulerImpl.class.getDeclaredField("healthTrackerOpt");
        field.setAccessible(true);
        field.set(ts, Option.apply(created));
        tracker = created;
        trackerInstalled = true;
        return tracker;
    }

    /** Whether tailguard installed the HealthTracker (false: the user's, or none yet). */
    public synchronized boolean installedTracker() {
        return trackerInstalled;
    }

    @SuppressWarnings("unchecked")
    private static void refresh(HealthTracker ht) throws ReflectiveOperationException {
        // What HealthTracker itself does after a change: the lock-free copy that excludedNodes()
        // serves, and the earliest expiry that applyExcludeOnFailureTimeout() checks against.
        Field list = HealthTracker.class.getDeclaredField("_excludedNodeList");
        list.setAccessible(true);
        ((AtomicReference<Object>) list.get(ht)).set(ht.nodeIdToExcludedExpiryTime().keySet().toSet());
        long next = Long.MAX_VALUE;
        for (Object until : JavaConverters.asJavaCollection(ht.nodeIdToExcludedExpiryTime().values())) {
            next = Math.min(next, (Long) until);
        }
        for (Object status : JavaConverters.asJavaCollection(ht.executorIdToExcludedStatus().values())) {
            Method expiry = status.getClass().getMethod("expiryTime");
            expiry.setAccessible(true);  // ExcludedExecutor is a private case class
            next = Math.min(next, (Long) expiry.invoke(status));
        }
        ht.nextExpiryTime_$eq(next);
    }

    private static void revive(TaskSchedulerImpl ts) {
        SchedulerBackend backend = ts.backend();
        if (backend != null) backend.reviveOffers();
    }

    private static List<String> split(String joined) {
        List<String> out = new ArrayList<>();
        for (String part : joined.split(",")) if (!part.isEmpty()) out.add(part);
        return out;
    }

    private static String[] ok() {
        return new String[] {"OK"};
    }

    private static String[] no(String reason) {
        return new String[] {"NO", reason};
    }
}
