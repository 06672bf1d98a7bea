package tailguard.attach;

import java.util.Collections;
import java.util.Map;

import org.apache.spark.SparkContext;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;
import tailguard.observe.TaskEventListener;

/**
 * The no-code form of attach mode: {@code --conf spark.plugins=tailguard.attach.AttachPlugin}.
 *
 * Spark initialises plugins inside the SparkContext's constructor, before the listener bus starts
 * and before the task scheduler exists: the plugin adds tailguard's listener (so the relay sees
 * the application from its start) with an {@link Actuator} for this context, which reaches the
 * scheduler only when the first command arrives. Settings are the {@code spark.tailguard.*}
 * keys, as for the listener alone. Nothing runs on the executors.
 */
public class AttachPlugin implements SparkPlugin {
    @Override
    public DriverPlugin driverPlugin() {
        return new DriverPlugin() {
            @Override
            public Map<String, String> init(SparkContext sc, PluginContext ctx) {
                try {
                    TaskEventListener listener = new TaskEventListener(sc.conf());
                    listener.setActuator(new Actuator(sc));
                    sc.addSparkListener(listener);
                } catch (RuntimeException | LinkageError e) {
                    // Never fail the application for tailguard: it runs as if unattached.
                    System.err.println("tailguard attach: not attached (" + e + "); the application runs without it");
                }
                return Collections.emptyMap();
            }
        };
    }

    @Override
    public ExecutorPlugin executorPlugin() {
        return null;
    }
}
