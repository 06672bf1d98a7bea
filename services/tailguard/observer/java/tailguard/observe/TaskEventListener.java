package tailguard.observe;

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.TimeUnit;

import org.apache.spark.SparkConf;
import org.apache.spark.executor.TaskMetrics;
import org.apache.spark.scheduler.JobSucceeded$;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerApplicationEnd;
import org.apache.spark.scheduler.SparkListenerApplicationStart;
import org.apache.spark.scheduler.AccumulableInfo;
import org.apache.spark.scheduler.SparkListenerExecutorAdded;
import org.apache.spark.scheduler.SparkListenerExecutorMetricsUpdate;
import org.apache.spark.scheduler.SparkListenerExecutorRemoved;
import org.apache.spark.scheduler.SparkListenerJobEnd;
import org.apache.spark.scheduler.SparkListenerJobStart;
import org.apache.spark.scheduler.SparkListenerStageCompleted;
import org.apache.spark.scheduler.SparkListenerStageSubmitted;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import org.apache.spark.scheduler.SparkListenerTaskStart;
import org.apache.spark.scheduler.StageInfo;
import org.apache.spark.scheduler.TaskInfo;
import scala.Tuple2;
import tailguard.attach.Actuator;
// JavaConverters, not scala.jdk.javaapi.CollectionConverters: PySpark 3.5 ships Scala 2.12,
// which lacks the latter; JavaConverters is in 2.12 and 2.13 (deprecated there, still present).
import scala.collection.JavaConverters;

/**
 * Spark's own task events, as tab-separated lines on the standard input of tailguard's relay
 * process (python -m tailguard.observer.relay), which turns them into tailguard events.
 *
 * Why a JVM listener and not a Python one over py4j: Spark calls listeners on its listener-bus
 * thread, one event at a time, and a queue that backs up drops events for every listener of the
 * application, the UI's included. A py4j callback costs a socket round trip per event plus one per
 * field read; here an event costs one formatted line written to a pipe (microseconds), and the
 * relay does the rest in its own process, off the driver's JVM and off the job's Python.
 *
 * Two ways in: spark.extraListeners=tailguard.observe.TaskEventListener (Spark calls the SparkConf
 * constructor; the relay starts with the application), or tailguard.observe(spark), which creates
 * one from Python, configures it and adds it to a running SparkContext.
 *
 * Attach mode: with an {@link Actuator} set (tailguard.attach.AttachPlugin, or tailguard.attach
 * from Python), the relay's standard output is the way back: it writes one action line per
 * command it has verified, a thread here applies it and answers on the same pipe as the events
 * ("CO id OK" or "CO id NO reason"). Both ends of that channel are an anonymous pipe between
 * this JVM and the child it started: no other process can write to it, and nothing listens on a
 * port or a path.
 */
public class TaskEventListener extends SparkListener {
    private static final String PREFIX = "spark.tailguard.";
    /**
     * The local property that leaves a Spark job out: its events are not published, so the
     * services neither judge its tasks nor command it, and the query-stage rule leaves its
     * stages to Spark. For the jobs that are not the application's work: a warm-up that starts
     * the executors' Python workers (its cold tasks would read as slow hosts), a probe, a
     * sample. Set it on the thread that runs them:
     * {@code sc.setLocalProperty("tailguard.ignore", "true")}, or {@code attachment.ignoring()}.
     */
    public static final String IGNORE = "tailguard.ignore";

    private final List<String> command = new ArrayList<>();
    private final List<String[]> settings = new ArrayList<>();
    private Process relay;
    private BufferedWriter out;
    private boolean broken;
    // What the listener costs Spark's listener-bus thread: time inside write(), and its events.
    private long busNanos;
    private long events;
    private Actuator actuator;
    // What is left out (IGNORE): running jobs, running stages and their tasks. A stage runs
    // under the local properties of the job that submitted it (Spark's rule for a stage two
    // jobs share), so it is left out with that job. Spark posts every event on its one
    // listener-bus thread, so these need no lock of their own.
    private final Set<Integer> ignoredJobs = new HashSet<>();
    private final Set<Integer> ignoredStages = new HashSet<>();
    private final Set<Long> ignoredTasks = new HashSet<>();
    private long jobsLeftOut;

    public TaskEventListener() {}

    /** Whether a job or stage with these local properties is left out of what is published. */
    public static boolean ignored(Properties properties) {
        return properties != null && ignored(properties.getProperty(IGNORE));
    }

    /** Whether IGNORE's value (null: not set) leaves work out. */
    public static boolean ignored(String value) {
        return value != null && "true".equalsIgnoreCase(value.trim());
    }

    /** The spark.extraListeners form: settings are the spark.tailguard.* keys (prefix dropped). */
    public TaskEventListener(SparkConf conf) {
        for (Tuple2<String, String> kv : conf.getAllWithPrefix(PREFIX)) {
            if (kv._1().equals("observe.python")) continue;
            settings.add(new String[] {kv._1(), kv._2()});
        }
        String python = conf.get(PREFIX + "observe.python", defaultPython());
        command.add(python);
        command.add("-m");
        command.add("tailguard.observer.relay");
    }

    private static String defaultPython() {
        Map<String, String> env = System.getenv();
        for (String key : new String[] {"PYSPARK_DRIVER_PYTHON", "PYSPARK_PYTHON"}) {
            String value = env.get(key);
            if (value != null && !value.isEmpty()) return value;
        }
        return "python3";
    }

    // ------------------------------------------------------------------ the Python form

    public void setCommand(String[] argv) {
        command.clear();
        for (String a : argv) command.add(a);
    }

    public void setting(String key, String value) {
        settings.add(new String[] {key, value});
    }

    /** Attach mode: the relay's verified commands are applied by `actuator`. */
    public void setActuator(Actuator actuator) {
        this.actuator = actuator;
        actuator.connect(this::send);
    }

    /** The application, for a listener added after the application started. */
    public void attached(long time, String appId, String appName) {
        write("A", time, appId, appName);
    }

    public void executor(long time, String executorId, String host, int cores) {
        write("X", time, executorId, host, cores);
    }

    /** Ends the stream and waits for the relay to publish what it holds; its exit status. */
    public synchronized int finish(long time, long timeoutMs) throws InterruptedException {
        write("E", time);
        if (relay == null) return 0;
        System.err.printf("tailguard observe: the listener took %.1f ms of the listener bus for %d events;"
                          + " %d jobs left out (%s)%n", busNanos / 1e6, events, jobsLeftOut, IGNORE);
        try {
            out.close();
        } catch (IOException e) {
            broken = true;
        }
        if (!relay.waitFor(timeoutMs, TimeUnit.MILLISECONDS)) {
            relay.destroy();
            return -1;
        }
        return relay.exitValue();
    }

    // ------------------------------------------------------------------ Spark's events

    @Override
    public void onApplicationStart(SparkListenerApplicationStart event) {
        String appId = event.appId().isDefined() ? event.appId().get() : "app";
        write("A", event.time(), appId, event.appName());
    }

    @Override
    public void onApplicationEnd(SparkListenerApplicationEnd event) {
        try {
            finish(event.time(), 60_000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    @Override
    public void onExecutorAdded(SparkListenerExecutorAdded event) {
        write("X", event.time(), event.executorId(), event.executorInfo().executorHost(),
              event.executorInfo().totalCores());
    }

    @Override
    public void onExecutorRemoved(SparkListenerExecutorRemoved event) {
        write("XR", event.time(), event.executorId(), event.reason());
    }

    /**
     * A running task's progress, from the executor's heartbeat (every
     * spark.executor.heartbeatInterval, 10 s by default): what it has read so far. Spark gives
     * nothing finer about a running task; a task without input or shuffle reads is not reported.
     */
    @Override
    public void onExecutorMetricsUpdate(SparkListenerExecutorMetricsUpdate event) {
        long now = System.currentTimeMillis();
        // Scala 2.12's collection.Seq or 2.13's immutable.Seq: both are a collection.Seq.
        scala.collection.Seq<?> updates = event.accumUpdates();
        for (Object item : JavaConverters.seqAsJavaList(updates)) {
            scala.Tuple4<?, ?, ?, ?> update = (scala.Tuple4<?, ?, ?, ?>) item;
            if (ignoredTasks.contains((Long) update._1())) continue;
            long inBytes = -1, inRecords = -1, shuffleBytes = -1, shuffleRecords = -1;
            for (Object a : JavaConverters.seqAsJavaList((scala.collection.Seq<?>) update._4())) {
                AccumulableInfo info = (AccumulableInfo) a;
                if (info.name().isEmpty() || info.update().isEmpty()) continue;
                Object value = info.update().get();
                if (!(value instanceof Long)) continue;
                long v = (Long) value;
                switch (info.name().get()) {
                    case "internal.metrics.input.bytesRead": inBytes = v; break;
                    case "internal.metrics.input.recordsRead": inRecords = v; break;
                    case "internal.metrics.shuffle.read.remoteBytesRead":
                    case "internal.metrics.shuffle.read.localBytesRead":
                        shuffleBytes = Math.max(shuffleBytes, 0) + v; break;
                    case "internal.metrics.shuffle.read.recordsRead": shuffleRecords = v; break;
                    default: break;
                }
            }
            if (inBytes >= 0 || shuffleBytes >= 0) {
                write("TP", now, update._1(), inBytes, inRecords, shuffleBytes, shuffleRecords);
            }
        }
    }

    @Override
    public void onJobStart(SparkListenerJobStart event) {
        List<StageInfo> stages = JavaConverters.seqAsJavaList(event.stageInfos());
        if (ignored(event.properties())) {
            ignoredJobs.add(event.jobId());
            jobsLeftOut++;
            return;
        }
        write("J", event.time(), event.jobId(), stages.size());
        for (StageInfo stage : stages) {
            StringBuilder parents = new StringBuilder();
            for (Object parent : JavaConverters.seqAsJavaList(stage.parentIds())) {
                if (parents.length() > 0) parents.append(',');
                parents.append(parent);
            }
            write("G", event.jobId(), stage.stageId(), stage.numTasks(), parents, stage.name());
        }
    }

    @Override
    public void onJobEnd(SparkListenerJobEnd event) {
        if (ignoredJobs.remove(event.jobId())) return;
        boolean ok = event.jobResult() == JobSucceeded$.MODULE$;
        write("JE", event.time(), event.jobId(), ok ? "SUCCEEDED" : "FAILED");
    }

    @Override
    public void onStageSubmitted(SparkListenerStageSubmitted event) {
        if (ignored(event.properties())) ignoredStages.add(event.stageInfo().stageId());
    }

    @Override
    public void onStageCompleted(SparkListenerStageCompleted event) {
        ignoredStages.remove(event.stageInfo().stageId());
    }

    @Override
    public void onTaskStart(SparkListenerTaskStart event) {
        TaskInfo t = event.taskInfo();
        if (ignoredStages.contains(event.stageId())) {
            ignoredTasks.add(t.taskId());
            return;
        }
        write("TS", t.launchTime(), t.taskId(), event.stageId(), event.stageAttemptId(), t.index(),
              t.partitionId(), t.attemptNumber(), t.executorId(), t.host(), t.speculative() ? 1 : 0);
    }

    @Override
    public void onTaskEnd(SparkListenerTaskEnd event) {
        TaskInfo t = event.taskInfo();
        // Its own set, not the stage's: a task may end after its job (a speculative copy).
        if (ignoredTasks.remove(t.taskId())) return;
        TaskMetrics m = event.taskMetrics();  // null when a task failed before it reported any
        long inBytes = -1, inRecords = -1, shuffleBytes = -1, shuffleRecords = -1;
        if (m != null) {
            inBytes = m.inputMetrics().bytesRead();
            inRecords = m.inputMetrics().recordsRead();
            shuffleBytes = m.shuffleReadMetrics().totalBytesRead();
            shuffleRecords = m.shuffleReadMetrics().recordsRead();
        }
        String reason = event.reason().getClass().getSimpleName().replace("$", "");
        String message = reason.equals("Success") ? "" : event.reason().toString();
        if (message.length() > 500) message = message.substring(0, 500);
        write("TE", t.finishTime(), t.taskId(), event.stageId(), event.stageAttemptId(), reason,
              inBytes, inRecords, shuffleBytes, shuffleRecords, message);
    }

    // ------------------------------------------------------------------ the pipe

    private synchronized void write(Object... fields) {
        if (broken || command.isEmpty()) return;
        long began = System.nanoTime();
        send(fields);
        busNanos += System.nanoTime() - began;
        events++;
    }

    private synchronized void send(Object... fields) {
        if (broken) return;
        try {
            if (out == null) start();
            StringBuilder line = new StringBuilder(96);
            for (int i = 0; i < fields.length; i++) {
                if (i > 0) line.append('\t');
                // Names are free text: a tab or a line break would split the record.
                line.append(String.valueOf(fields[i]).replace('\t', ' ').replace('\n', ' ').replace('\r', ' '));
            }
            line.append('\n');
            out.write(line.toString());
            // One write per event: the relay sees each event as it happens.
            out.flush();
        } catch (IOException e) {
            // The relay is gone: stop writing, never fail the application for it.
            broken = true;
            System.err.println("tailguard observe: the relay stopped (" + e + "); events are no longer published");
        }
    }

    private void start() throws IOException {
        ProcessBuilder builder = new ProcessBuilder(command);
        builder.redirectOutput(actuator == null ? ProcessBuilder.Redirect.INHERIT : ProcessBuilder.Redirect.PIPE);
        builder.redirectError(ProcessBuilder.Redirect.INHERIT);
        relay = builder.start();
        out = new BufferedWriter(new OutputStreamWriter(relay.getOutputStream(), StandardCharsets.UTF_8), 1 << 16);
        // Settings travel on the pipe, not the command line, where any user of the host could read
        // a secret among them.
        for (String[] kv : settings) send("C", kv[0], kv[1]);
        if (actuator != null) {
            send("ACT");  // the relay may act: someone applies what it writes back
            Thread serving = new Thread(() -> serve(relay.getInputStream()), "tailguard-actuator");
            serving.setDaemon(true);
            serving.start();
        }
    }

    /** The relay's action lines, applied one at a time; each answered on the events pipe. */
    private void serve(InputStream in) {
        try (BufferedReader lines = new BufferedReader(new InputStreamReader(in, StandardCharsets.UTF_8))) {
            String line;
            while ((line = lines.readLine()) != null) {
                String[] f = line.split("\t", -1);
                if (f[0].equals("PROBE")) {
                    // The relay probes only when it acts, and gives the decision timeout in ms.
                    if (f.length > 1) actuator.relayActs(Long.parseLong(f[1]));
                    for (Map.Entry<String, String> kind : actuator.probe().entrySet()) {
                        send("AV", kind.getKey(), kind.getValue());
                    }
                    send("AV", "", "");
                    continue;
                }
                if (f.length < 2) continue;
                String[] outcome;
                try {
                    outcome = actuator.handle(f);
                } catch (RuntimeException | LinkageError e) {
                    outcome = new String[] {"NO", "failed while applying: " + e};
                }
                Object[] answer = new Object[outcome.length + 2];
                answer[0] = "CO";
                answer[1] = f[1];
                System.arraycopy(outcome, 0, answer, 2, outcome.length);
                send(answer);
            }
        } catch (IOException e) {
            // The relay is gone; so are its commands.
        }
    }
}
