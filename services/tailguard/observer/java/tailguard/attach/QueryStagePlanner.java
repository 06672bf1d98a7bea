package tailguard.attach;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The query-stage rule's requests for reducer ranges, and the decisions that answer them.
 *
 * A request goes to the relay as one {@code PS} line (the map outputs' bytes per reducer
 * partition, per shuffle); the relay turns it into a job for the decider, and the decider's
 * SetParallelism comes back as a {@code RANGES} action line, which completes the request. The
 * rule's thread (Spark's query planning) waits at most {@code timeoutMs}; without a decision by
 * then Spark's own ranges stand, and a {@code PE} line says which way it went. After a deadline
 * is missed the rule stops waiting (Spark plans as it would unattached) until a decision
 * arrives again, late or not: a decider that is down costs the application one deadline, not
 * one per query stage.
 */
final class QueryStagePlanner {
    private static final int KEPT = 256;

    private static final class Request {
        final int partitions;
        final CompletableFuture<int[]> answer = new CompletableFuture<>();

        Request(int partitions) {
            this.partitions = partitions;
        }
    }

    private final long timeoutMs;
    private final AtomicLong requests = new AtomicLong();
    private final Map<Long, Request> waiting = new ConcurrentHashMap<>();
    // Ranges already decided, by the shuffles read: a plan Spark makes again (a re-optimised
    // query, a reused exchange) reads them the same way without asking twice.
    private final Map<String, int[]> decided = new LinkedHashMap<String, int[]>(16, 0.75f, true) {
        @Override
        protected boolean removeEldestEntry(Map.Entry<String, int[]> eldest) {
            return size() > KEPT;
        }
    };
    private volatile boolean late;

    QueryStagePlanner(long timeoutMs) {
        this.timeoutMs = timeoutMs;
    }

    long timeoutMs() {
        return timeoutMs;
    }

    /**
     * The exclusive end of each reducer range for the shuffles {@code shuffles} (their bytes per
     * reducer partition in {@code bytes}), or null: keep Spark's. Blocks the calling thread up to
     * the deadline.
     */
    int[] ranges(Actuator.Channel channel, int[] shuffles, long[][] bytes, int partitions, int floor) {
        StringBuilder key = new StringBuilder();
        for (int s : shuffles) key.append(s).append(',');
        synchronized (decided) {
            int[] known = decided.get(key.toString());
            if (known != null) return known;
        }
        long id = requests.incrementAndGet();
        Request request = new Request(partitions);
        waiting.put(id, request);
        Object[] line = new Object[5 + shuffles.length];
        line[0] = "PS";
        line[1] = System.currentTimeMillis();
        line[2] = id;
        line[3] = partitions;
        line[4] = floor;
        for (int i = 0; i < shuffles.length; i++) {
            StringBuilder sizes = new StringBuilder(shuffles[i] + ":");
            for (int p = 0; p < bytes[i].length; p++) {
                if (p > 0) sizes.append(',');
                sizes.append(bytes[i][p]);
            }
            line[5 + i] = sizes;
        }
        channel.send(line);
        int[] ends = null;
        String outcome;
        try {
            if (late) {
                outcome = "not waited for: an earlier decision missed its deadline";
            } else {
                ends = request.answer.get(timeoutMs, TimeUnit.MILLISECONDS);
                outcome = "applied";
            }
        } catch (TimeoutException e) {
            outcome = "no decision within " + timeoutMs + " ms (tailguard.attach.decision-timeout)";
            late = true;
            System.err.println("tailguard attach: " + outcome + "; Spark's ranges are kept until the decider answers again");
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            outcome = "the planning thread was interrupted";
        } catch (ExecutionException e) {
            outcome = "failed: " + e.getCause();
        } finally {
            if (waiting.remove(id) == null && ends == null) {
                // The decision arrived between the deadline and here: it is taken.
                ends = request.answer.getNow(null);
            }
        }
        if (ends != null) {
            outcome = "applied";
            synchronized (decided) {
                decided.put(key.toString(), ends);
            }
        }
        channel.send("PE", System.currentTimeMillis(), id, outcome);
        return ends;
    }

    /** A {@code RANGES id request ends} action: OK if the request still waits and the ranges fit. */
    String[] answer(String requestId, String endsCsv) {
        Request request = waiting.get(Long.parseLong(requestId));
        late = false;  // the decider answers again
        if (request == null) {
            return new String[] {"NO", "query stage plan " + requestId + " no longer waits: Spark planned it with its own "
                                 + "ranges (no decision within " + timeoutMs + " ms, tailguard.attach.decision-timeout)"};
        }
        String[] parts = endsCsv.split(",");
        int[] ends = new int[parts.length];
        int last = 0;
        for (int i = 0; i < parts.length; i++) {
            ends[i] = Integer.parseInt(parts[i]);
            if (ends[i] <= last) return new String[] {"NO", "reducer ranges must be non-empty and in order: " + endsCsv};
            last = ends[i];
        }
        if (last != request.partitions) {
            return new String[] {"NO", "the ranges end at " + last + ", not at the " + request.partitions + " reducer partitions"};
        }
        if (waiting.remove(Long.parseLong(requestId)) == null) {
            return new String[] {"NO", "query stage plan " + requestId + " stopped waiting: Spark planned it with its own ranges"};
        }
        request.answer.complete(ends);
        return new String[] {"OK"};
    }
}
