package tailguard.attach;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.execution.SparkPlan;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * {@code --conf spark.sql.extensions=tailguard.attach.AttachExtensions}: registers the
 * query-stage rule ({@link ParallelismRule}) that applies the decider's SetParallelism to
 * adaptive query execution's shuffle reads. Spark builds one rule per session; each finds the
 * application's {@link Actuator} when it runs, and does nothing where there is none.
 */
public final class AttachExtensions extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
    @Override
    public BoxedUnit apply(SparkSessionExtensions extensions) {
        try {
            extensions.injectQueryStageOptimizerRule(new AbstractFunction1<SparkSession, Rule<SparkPlan>>() {
                @Override
                public Rule<SparkPlan> apply(SparkSession session) {
                    return new ParallelismRule(session);
                }
            });
        } catch (LinkageError e) {
            // A Spark without query-stage optimizer rules (before 3.5): SetParallelism stays off.
            System.err.println("tailguard attach: this Spark cannot take a query-stage rule (" + e + "); SetParallelism is off");
        }
        return BoxedUnit.UNIT;
    }
}
