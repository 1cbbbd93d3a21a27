/* The default policy's usual decision, compiled: what the executor thread runs between two batches.
 *
 * Why: under load the executor decides the next batch itself as one ends (runtime/executor.py),
 * and the backend idles for as long as that decision takes. In Python it takes ~22 us on an idle
 * core and ~32 us beside a busy event loop, against batches of ~0.5 ms on the demo models: the
 * executor cannot be busy 95 % of the time. This file computes the same decision in ~2 us.
 *
 * Same decision, bit for bit: it is GuardedStabilityPolicy.decide (guarded.py) for the states that
 * decide nearly every batch under load, with the same arithmetic in the same order as the scorer
 * fast_scoring picks for them (scoring_python.python_candidates where every queue has one budget
 * and the state is small, scoring_deep.deep_candidates where it is not, and where budgets are mixed
 * in a few runs per queue past the loop's size; reference.reference_candidates' per-task loop for
 * small states that mix budgets: requests with their own deadlines or capture times, and the
 * server's plans as its measured lag steps),
 * candidates.choose_exits (rule "safe"), candidates.pick_min and the guard (guarded.none_doomed, then queue_chunks, doomed, unavoidable and the search of
 * GuardedStabilityPolicy._guard: under overload, on a 2-core box, 10-20 % of decisions needed that
 * search, ~90 us each in Python). Compile with -ffp-contract=off (setup.py): a fused multiply-add
 * would round differently. tests/scheduler/test_quick_decide.py, test_deep_scoring.py and
 * test_deep_runs.py compare it with the Python path on random states and long runs, exactly.
 *
 * decide(queues, models, now, theta, clip, code, batch_cap, small_state, small_loop, tie_rtol,
 *        lookahead_batches, none_doomed_margin, split, dominance, pivot_span, max_runs)
 *   -> (model, exit_id, batch, predicted_s, score) | None: a Dispatch's fields; `split`: the batch
 *      rule "lookahead" (ModelLatency.batch_for cuts the batch), else "max".
 *
 * Deep queues (every queue with one budget, past small_state: a fast GPU's 50 ms deadline is many
 * batches long, so its queues hold hundreds to thousands of tasks; or budgets mixed past the loop's
 * size, every queue at most max_runs runs of one budget: a server's planned budget steps):
 * scoring_deep.deep_candidates, O(runs log n) per candidate and queue from the prefix sums each
 * TaskQueue keeps per run (_hi, _lo, and each run's row of _runs), which this code extends over the
 * tasks that arrived since the last decision and rebases as scoring_deep.refresh does (the same
 * code, the same order: the Dispatch is the Python one's to the bit). So decide() may write _hi,
 * _lo and the cache fields of _runs' rows, never anything else of the queue.
 * dominance, pivot_span, max_runs: scoring_deep.DOMINANCE, PIVOT_SPAN and MAX_RUNS.
 *
 * None whenever the case is not the usual one (budgets interleaved, past max_runs runs in a queue,
 * in a state too big for the loop; no queued task; anything of an unexpected type): the Python
 * path then decides, as it always could. It reads TaskQueue's slots (_head, _tail, _arrival,
 * _budget, _deadline, _runs, _run_head, _run_tail; and writes _hi, _lo, _runs) and ModelLatency's
 * max_batch, by_batch, exit_ids, splits and alone_splits.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#define MAX_QUEUES 64
#define MAX_TASKS 256 /* small_state (200) and small_loop (120) bound the tasks the copying scorers take */
#define MAX_RUNS 8    /* the most runs of one budget per queue the deep path takes (scoring_deep.MAX_RUNS) */
/* TaskQueue._runs: RUN_FIELDS floats per run (queues.py) */
#define RUN_FIELDS 6
#define RUN_START 0
#define RUN_BUDGET 1
#define RUN_CACHED 2
#define RUN_PIVOT 3
#define RUN_ANCHOR 4
#define RUN_DONE 5

/* One run of one budget of a deep queue: its tasks [start, stop) and its terms (scoring_deep). */
typedef struct {
    double *row; /* its floats in the queue's _runs (the cache is written there) */
    Py_ssize_t start, stop, k0, k1, anchor;
    double budget, cexp; /* cexp: (now - pivot) / budget */
} Run;

typedef struct {
    PyObject *queue; /* borrowed from the caller's list */
    /* the deep path (scoring_deep.py): the queue's _arrival, _hi, _lo, _runs and _deadline, held while deciding */
    Py_buffer views[5];
    int n_views;
    const double *arr; /* every slot of the queue's arrivals (absolute indices, as the cache's) */
    double *hi, *lo;   /* the runs' compensated prefix sums */
    Py_ssize_t tail, run_head, n_runs;
    Run runs[MAX_RUNS];
    Py_ssize_t index, head, n, k, max_batch, size, batch, exit, paper, protective;
    int uniform; /* one budget: one run (the factorised score); else runs, or the per-task loop */
    double budget, slack, head_deadline, delta, score;
    double *neg_ys;   /* n values, oldest first: (arrival - now) / budget (first the arrivals) */
    double *suffix;   /* n - k + 1 values: suffix[i - k] = sum of the factors of tasks i..n-1 */
    double *budgets;  /* the loop: n values */
    double *deadlines; /* the loop: n values */
    PyObject *by_batch; /* a reference the clean-up releases */
} Live;

static PyObject *s_head, *s_tail, *s_arrival, *s_budget, *s_deadline, *s_run_head, *s_run_tail, *s_runs, *s_max_batch,
    *s_by_batch, *s_exit_ids, *s_splits, *s_alone_splits, *s_hi, *s_lo;

static int get_ssize(PyObject *obj, PyObject *name, Py_ssize_t *out) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) return -1;
    *out = PyLong_Check(value) ? PyLong_AsSsize_t(value) : -1;
    Py_DECREF(value);
    if (*out == -1 && PyErr_Occurred()) return -1;
    return *out < 0 ? -1 : 0;
}

/* One double of a 1-D float64 array attribute, at index i. */
static int get_item(PyObject *obj, PyObject *name, Py_ssize_t i, Py_ssize_t count, double *out) {
    PyObject *array = PyObject_GetAttr(obj, name);
    if (array == NULL) return -1;
    Py_buffer view;
    int rc = PyObject_GetBuffer(array, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT);
    Py_DECREF(array);
    if (rc < 0) return -1;
    rc = -1;
    if (view.ndim == 1 && view.itemsize == 8 && view.format != NULL && strcmp(view.format, "d") == 0 &&
        i + count <= view.shape[0]) {
        memcpy(out, (double *)view.buf + i, (size_t)count * sizeof(double));
        rc = 0;
    }
    PyBuffer_Release(&view);
    return rc;
}

/* by_batch[b][e] as a double (b, e zero-based); -1 if the table is not what ModelLatency builds. */
static int table(PyObject *by_batch, Py_ssize_t b, Py_ssize_t e, double *out) {
    if (!PyTuple_Check(by_batch) || b < 0 || b >= PyTuple_GET_SIZE(by_batch)) return -1;
    PyObject *column = PyTuple_GET_ITEM(by_batch, b);
    if (!PyTuple_Check(column) || e < 0 || e >= PyTuple_GET_SIZE(column)) return -1;
    PyObject *value = PyTuple_GET_ITEM(column, e);
    if (!PyFloat_Check(value)) return -1;
    *out = PyFloat_AS_DOUBLE(value);
    return 0;
}

/* splits[n - 1][exit_pos] (ModelLatency.batch_for, from the attribute `name`); -1 if not a table of ints. */
static Py_ssize_t batch_for(PyObject *model, PyObject *name, Py_ssize_t n, Py_ssize_t exit_pos) {
    PyObject *splits = PyObject_GetAttr(model, name);
    if (splits == NULL) return -1;
    Py_ssize_t batch = -1;
    if (PyTuple_Check(splits) && n >= 1 && n <= PyTuple_GET_SIZE(splits)) {
        PyObject *row = PyTuple_GET_ITEM(splits, n - 1);
        if (PyTuple_Check(row) && exit_pos < PyTuple_GET_SIZE(row) && PyLong_Check(PyTuple_GET_ITEM(row, exit_pos)))
            batch = PyLong_AsSsize_t(PyTuple_GET_ITEM(row, exit_pos));
    }
    Py_DECREF(splits);
    return batch >= 1 && batch <= n ? batch : -1;
}

static Py_ssize_t n_exits(PyObject *by_batch, Py_ssize_t b) {
    return PyTuple_GET_SIZE(PyTuple_GET_ITEM(by_batch, b)); /* checked by table() first */
}

/* ModelLatency.deepest_feasible */
static int deepest_feasible(PyObject *by_batch, Py_ssize_t batch, double slack, Py_ssize_t *out) {
    double value;
    if (table(by_batch, batch - 1, 0, &value) < 0) return -1;
    for (Py_ssize_t pos = n_exits(by_batch, batch - 1) - 1; pos >= 0; pos--) {
        table(by_batch, batch - 1, pos, &value);
        if (value <= slack) {
            *out = pos;
            return 0;
        }
    }
    *out = 0;
    return 0;
}

/* bisect.bisect_right */
static Py_ssize_t bisect_right(const double *a, Py_ssize_t n, double x) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (x < a[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* A queue: its length and its runs of one budget (its arrivals are read once the scorer is
 * chosen); 1: empty (skip), 0: read, -1: not a state this file takes. */
static int read_queue(PyObject *queue, Live *q) {
    Py_ssize_t head, tail, run_head, run_tail;
    if (get_ssize(queue, s_head, &head) < 0 || get_ssize(queue, s_tail, &tail) < 0) return -1;
    q->queue = queue;
    q->head = head;
    q->tail = tail;
    q->n = tail - head;
    q->k = 0; /* the loop clips nothing ahead (factorise sets it) */
    q->deadlines = NULL; /* read_loop reads them all */
    q->n_views = 0;
    if (q->n <= 0) return q->n == 0 ? 1 : -1;
    if (get_ssize(queue, s_run_head, &run_head) < 0 || get_ssize(queue, s_run_tail, &run_tail) < 0) return -1;
    if (run_tail <= run_head) return -1;
    q->run_head = run_head;
    q->n_runs = run_tail - run_head;
    q->uniform = q->n_runs == 1;
    q->budget = NAN; /* read where it is needed (factorise; the deep path reads each run's) */
    return 0;
}

/* scoring_python.python_candidates' per-queue terms (one budget): -y's, clipped prefix, suffix sums. */
static int factorise(Live *q, double now, double theta, int code, double *sums) {
    if (get_item(q->queue, s_deadline, q->head, 1, &q->head_deadline) < 0) return -1;
    if (get_item(q->queue, s_runs, q->run_head * RUN_FIELDS + RUN_BUDGET, 1, &q->budget) < 0) return -1;
    double *ys = q->neg_ys, budget = q->budget, first_arrival = ys[0];
    for (Py_ssize_t i = 0; i < q->n; i++) ys[i] = (ys[i] - now) / budget;
    q->k = bisect_right(ys, q->n, -theta);
    /* accumulate(factors of tasks n-1 .. k, initial=0.0), then reversed */
    Py_ssize_t m = q->n - q->k;
    double total = 0.0;
    sums[m] = 0.0;
    for (Py_ssize_t j = 1; j <= m; j++) {
        double v = ys[q->n - j];
        total += code ? exp(-v - 1.0) : expm1(-v);
        sums[m - j] = total;
    }
    q->suffix = sums;
    q->slack = (first_arrival + budget) - now;
    return 0;
}

/* scoring_deep.first_above: the first index in [lo, hi) whose (arrival - now) / budget > limit */
static Py_ssize_t first_above(const double *a, Py_ssize_t lo, Py_ssize_t hi, double now, double budget,
                              double limit) {
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (limit < (a[mid] - now) / budget)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* A 1-D float64 array attribute of at least `size` items, held in *view (writable if asked). */
static int hold(PyObject *obj, PyObject *name, Py_buffer *view, int writable, Py_ssize_t size) {
    PyObject *array = PyObject_GetAttr(obj, name);
    if (array == NULL) return -1;
    int rc = PyObject_GetBuffer(array, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0));
    Py_DECREF(array);
    if (rc < 0) return -1;
    if (view->ndim == 1 && view->itemsize == 8 && view->format != NULL && strcmp(view->format, "d") == 0 &&
        view->shape[0] >= size)
        return 0;
    PyBuffer_Release(view);
    return -1;
}

/* scoring_deep.refresh (the same code, the same order): one run's prefix sums extended to its end,
 * or rebased; its k0, anchor and cexp. */
static void run_refresh(Run *r, const double *a, double *hi, double *lo, double now, double theta, double dominance,
                        double pivot_span) {
    double *row = r->row, budget = r->budget;
    Py_ssize_t start = r->start, stop = r->stop;
    Py_ssize_t k0 = first_above(a, start, stop, now, budget, -theta);
    double cached = row[RUN_CACHED], pivot = row[RUN_PIVOT];
    /* the cache's indices; anything else than what the queue and this code write: rebuilt */
    int sane = row[RUN_ANCHOR] >= 0.0 && row[RUN_ANCHOR] <= (double)stop && row[RUN_DONE] >= 0.0 &&
               row[RUN_DONE] <= (double)stop;
    Py_ssize_t anchor = sane ? (Py_ssize_t)row[RUN_ANCHOR] : 0, done = sane ? (Py_ssize_t)row[RUN_DONE] : 0;
    if (!(sane && cached == budget && anchor <= k0 && k0 <= done && done <= stop &&
          (a[stop - 1] - pivot) / budget <= pivot_span)) { /* rebuild */
        anchor = done = k0;
        pivot = k0 < stop ? a[k0] : now;
    }
    for (Py_ssize_t i = done; i < stop; i++) { /* the tasks that arrived since: one exp each */
        double w = exp((pivot - a[i]) / budget);
        if (i == anchor) {
            hi[i] = w;
            lo[i] = 0.0;
        } else {
            double prev = hi[i - 1], sum = prev + w, bb = sum - prev;
            hi[i] = sum;
            lo[i] = lo[i - 1] + ((prev - (sum - bb)) + (w - bb));
        }
    }
    if (k0 > anchor && hi[k0 - 1] > dominance * (hi[stop - 1] - hi[k0 - 1])) { /* scoring_deep.shift_down */
        double base_lo = lo[k0 - 1], minus = -hi[k0 - 1];
        for (Py_ssize_t i = k0; i < stop; i++) {
            double prev = hi[i], sum = prev + minus, bb = sum - prev;
            hi[i] = sum;
            lo[i] = (lo[i] - base_lo) + ((prev - (sum - bb)) + (minus - bb));
        }
        anchor = k0;
    }
    row[RUN_CACHED] = budget;
    row[RUN_PIVOT] = pivot;
    row[RUN_ANCHOR] = (double)anchor;
    row[RUN_DONE] = (double)stop;
    r->k0 = k0;
    r->anchor = anchor;
    r->cexp = (now - pivot) / budget;
}

/* scoring_deep.deep_candidates' per-queue terms: every run's sums brought up to date (run_refresh),
 * the batch's slack (the least over the runs it spans of their oldest task's deadline, minus now)
 * and none_doomed's tightest deadline of the look-ahead (likewise). */
static int deep_refresh(Live *q, double now, double theta, double dominance, double pivot_span, Py_ssize_t lookahead) {
    static PyObject **names[5] = {&s_arrival, &s_hi, &s_lo, &s_runs, &s_deadline};
    if (q->n_runs > MAX_RUNS) return -1;
    for (int v = 0; v < 5; v++) {
        Py_ssize_t size = v == 3 ? (q->run_head + q->n_runs) * RUN_FIELDS : q->tail;
        if (hold(q->queue, *names[v], &q->views[v], v == 1 || v == 2 || v == 3, size) < 0) return -1;
        q->n_views++;
    }
    const double *a = q->views[0].buf, *deadline = q->views[4].buf;
    double *hi = q->views[1].buf, *lo = q->views[2].buf, *rows = q->views[3].buf;
    Py_ssize_t h = q->head, t = q->tail, served = h + q->batch;
    Py_ssize_t ahead = h + (q->n < q->size * lookahead ? q->n : q->size * lookahead);
    q->slack = INFINITY;
    q->head_deadline = INFINITY;
    for (Py_ssize_t i = 0; i < q->n_runs; i++) {
        Run *r = &q->runs[i];
        r->row = rows + (q->run_head + i) * RUN_FIELDS;
        double first = r->row[RUN_START], next = i + 1 < q->n_runs ? r->row[RUN_FIELDS + RUN_START] : (double)t;
        if (!(first >= 0.0 && first < next && next <= (double)t)) return -1; /* not what queues.py writes */
        r->start = (Py_ssize_t)first > h ? (Py_ssize_t)first : h;
        r->stop = (Py_ssize_t)next;
        r->budget = r->row[RUN_BUDGET];
        if (r->start >= r->stop || isnan(r->budget)) return -1;
        if (r->start < served && deadline[r->start] - now < q->slack) q->slack = deadline[r->start] - now;
        if (r->start < ahead && deadline[r->start] < q->head_deadline) q->head_deadline = deadline[r->start];
        run_refresh(r, a, hi, lo, now, theta, dominance, pivot_span);
    }
    if (isnan(q->slack) || isnan(q->head_deadline)) return -1;
    q->arr = a;
    q->hi = hi;
    q->lo = lo;
    return 0;
}

/* reference_candidates' per-queue terms (budgets mixed somewhere): budgets, deadlines, the batch's
 * slack (min(d - now) over its deadlines), and none_doomed's tightest deadline of the look-ahead. */
static int read_loop(Live *q, double now, Py_ssize_t lookahead, double *budgets, double *deadlines) {
    if (get_item(q->queue, s_budget, q->head, q->n, budgets) < 0) return -1;
    if (get_item(q->queue, s_deadline, q->head, q->n, deadlines) < 0) return -1;
    q->budgets = budgets;
    q->deadlines = deadlines;
    for (Py_ssize_t i = 0; i < q->n; i++)
        if (isnan(deadlines[i]) || isnan(budgets[i])) return -1;
    q->slack = deadlines[0] - now;
    for (Py_ssize_t i = 1; i < q->batch; i++)
        if (deadlines[i] - now < q->slack) q->slack = deadlines[i] - now;
    Py_ssize_t m = q->n < q->size * lookahead ? q->n : q->size * lookahead;
    q->head_deadline = deadlines[0];
    for (Py_ssize_t i = 1; i < m; i++)
        if (deadlines[i] < q->head_deadline) q->head_deadline = deadlines[i];
    return 0;
}

/* Urgency.__call__ */
static double urgency(double x, double theta, double clip, int code) {
    if (x >= theta) return clip;
    double u = code ? exp(x - 1.0) : expm1(x) / (M_E - 1.0);
    return clip < u ? clip : u;
}

/* bisect.bisect_left */
static Py_ssize_t bisect_left(const double *a, Py_ssize_t n, double x) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (a[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* One queued batch of the continuation (guarded._Chunk). */
typedef struct {
    double deadline, shallow;
    Py_ssize_t q, j, len;
    const double *part;
} Chunk;

/* The order of guarded._Chunk tuples: deadline, then queue, then position (never equal). */
static int chunk_order(const void *a, const void *b) {
    const Chunk *x = a, *y = b;
    if (x->deadline != y->deadline) return x->deadline < y->deadline ? -1 : 1;
    if (x->q != y->q) return x->q < y->q ? -1 : 1;
    return x->j < y->j ? -1 : (x->j > y->j);
}

/* guarded.queue_chunks (a queue with one budget has its deadlines in order; the others' batches are
 * sorted); the number of chunks, or -1 if a table or a deadline is not what it should be. */
static Py_ssize_t queue_chunks(const Live *live, Py_ssize_t count, Py_ssize_t lookahead, double *deadlines,
                               Chunk *chunks) {
    Py_ssize_t n_chunks = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const Live *q = &live[i];
        Py_ssize_t m = q->n < q->size * lookahead ? q->n : q->size * lookahead;
        if (q->deadlines != NULL) /* read already (read_loop); copied: a batch's part is sorted here */
            memcpy(deadlines, q->deadlines, (size_t)m * sizeof(double));
        else if (get_item(q->queue, s_deadline, q->head, m, deadlines) < 0)
            return -1;
        for (Py_ssize_t j = 0, start = 0; start < m; j++, start += q->size) {
            Chunk *c = &chunks[n_chunks++];
            c->part = deadlines + start;
            c->len = m - start < q->size ? m - start : q->size;
            c->deadline = c->part[0];
            c->q = q->index;
            c->j = j;
            if (!q->uniform) { /* part.sort(): an insertion sort of at most a batch */
                double *part = deadlines + start;
                for (Py_ssize_t a = 1; a < c->len; a++) {
                    double v = part[a];
                    Py_ssize_t b = a;
                    for (; b > 0 && v < part[b - 1]; b--) part[b] = part[b - 1];
                    part[b] = v;
                }
                c->deadline = part[0];
            }
            if (isnan(c->deadline) || table(q->by_batch, c->len - 1, 0, &c->shallow) < 0) return -1;
        }
        deadlines += m;
    }
    qsort(chunks, (size_t)n_chunks, sizeof(Chunk), chunk_order);
    return n_chunks;
}

/* guarded.doomed */
static Py_ssize_t doomed(const Chunk *chunks, Py_ssize_t n_chunks, Py_ssize_t first_queue, double first_delta,
                         double now) {
    double t = now + first_delta;
    Py_ssize_t late = 0;
    for (Py_ssize_t i = 0; i < n_chunks; i++) {
        const Chunk *c = &chunks[i];
        if (c->j == 0 && c->q == first_queue) {
            late += bisect_left(c->part, c->len, now + first_delta);
            continue;
        }
        t += c->shallow;
        if (c->deadline < t) late += bisect_left(c->part, c->len, t);
    }
    return late;
}

/* guarded.unavoidable */
static Py_ssize_t unavoidable(const Chunk *chunks, Py_ssize_t n_chunks, double now) {
    Py_ssize_t late = 0;
    for (Py_ssize_t i = 0; i < n_chunks; i++)
        if (chunks[i].deadline < now + chunks[i].shallow)
            late += bisect_left(chunks[i].part, chunks[i].len, now + chunks[i].shallow);
    return late;
}

/* A decision: what decide() returns. */
typedef struct {
    Py_ssize_t index, exit, batch;
    double delta, score;
} Move;

static Move move_of(const Live *c) { return (Move){c->index, c->exit, c->batch, c->delta, c->score}; }

/* GuardedStabilityPolicy._guard once none_doomed has failed; 0, or -1 (the Python path decides). */
static int guard_with(const Live *live, Py_ssize_t count, const Live *pick, double now, Py_ssize_t lookahead,
                      double *deadlines, Chunk *chunks, Move *out);

static int guard(const Live *live, Py_ssize_t count, const Live *pick, double now, Py_ssize_t lookahead,
                 Move *out) {
    double deadlines[MAX_TASKS];
    Chunk chunks[MAX_TASKS]; /* each holds at least one task */
    Py_ssize_t need = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t size = live[i].size, n = live[i].n;
        if (size > PY_SSIZE_T_MAX / (lookahead > 0 ? lookahead : 1)) return -1;
        need += n < size * lookahead ? n : size * lookahead;
    }
    if (need <= MAX_TASKS) return guard_with(live, count, pick, now, lookahead, deadlines, chunks, out);
    /* deep queues: the look-ahead's LOOKAHEAD_BATCHES batches of each */
    double *many = PyMem_Malloc((size_t)need * sizeof(double));
    Chunk *parts = PyMem_Malloc((size_t)need * sizeof(Chunk));
    int rc = many && parts ? guard_with(live, count, pick, now, lookahead, many, parts, out) : -1;
    PyMem_Free(many);
    PyMem_Free(parts);
    return rc;
}

static int guard_with(const Live *live, Py_ssize_t count, const Live *pick, double now, Py_ssize_t lookahead,
                      double *deadlines, Chunk *chunks, Move *out) {
    Py_ssize_t n_chunks = queue_chunks(live, count, lookahead, deadlines, chunks);
    if (n_chunks < 0) return -1;
    *out = move_of(pick);
    Py_ssize_t lost = doomed(chunks, n_chunks, pick->index, pick->delta, now);
    if (!lost || lost <= unavoidable(chunks, n_chunks, now)) return 0;
    Py_ssize_t floor[MAX_QUEUES], least = lost;
    for (Py_ssize_t i = 0; i < count; i++) {
        double shallowest;
        table(live[i].by_batch, live[i].batch - 1, 0, &shallowest);
        floor[i] = doomed(chunks, n_chunks, live[i].index, shallowest, now);
        if (floor[i] < least) least = floor[i];
    }
    if (least >= lost) return 0;
    Py_ssize_t best_count = -1;
    double best_score = 0.0;
    Move best = *out;
    for (Py_ssize_t i = 0; i < count; i++) {
        const Live *c = &live[i];
        if (floor[i] >= lost) continue; /* cannot save more than the pick */
        Py_ssize_t pos = c->exit, late = c == pick ? lost : doomed(chunks, n_chunks, c->index, c->delta, now);
        double delta = c->delta;
        while (late > floor[i] && pos > 0) { /* shallower until it saves what it can */
            pos--;
            table(c->by_batch, c->batch - 1, pos, &delta);
            late = doomed(chunks, n_chunks, c->index, delta, now);
        }
        double score = isfinite(c->score) ? c->score : INFINITY;
        if (best_count < 0 || late < best_count || (late == best_count && score < best_score)) {
            best_count = late;
            best_score = score;
            best = (Move){c->index, pos, c->batch, delta, c->score};
        }
    }
    if (best_count < lost) *out = best; /* another move saves strictly more tasks */
    return 0;
}

static PyObject *decide(PyObject *self, PyObject *args) {
    PyObject *queues, *models;
    double now, theta, clip, tie_rtol, margin, dominance, pivot_span;
    int code, split;
    Py_ssize_t batch_cap, small_state, small_loop, lookahead, max_runs;
    if (!PyArg_ParseTuple(args, "OOdddpnnndndpddn", &queues, &models, &now, &theta, &clip, &code, &batch_cap,
                          &small_state, &small_loop, &tie_rtol, &lookahead, &margin, &split, &dominance, &pivot_span,
                          &max_runs))
        return NULL;
    if (!PyList_Check(queues) && !PyTuple_Check(queues)) Py_RETURN_NONE;
    if (!PyTuple_Check(models) || !isfinite(theta)) Py_RETURN_NONE;
    Py_ssize_t n_queues = PySequence_Fast_GET_SIZE(queues);
    if (n_queues > MAX_QUEUES || n_queues > PyTuple_GET_SIZE(models)) Py_RETURN_NONE;

    Live live[MAX_QUEUES];
    double ys[MAX_TASKS], sums[MAX_TASKS + MAX_QUEUES], budgets[MAX_TASKS], deadlines[MAX_TASKS];
    Py_ssize_t count = 0, tasks = 0, used = 0, most_runs = 0;
    int mixed = 0;
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < n_queues; i++) {
        Live *q = &live[count];
        int rc = read_queue(PySequence_Fast_GET_ITEM(queues, i), q);
        if (rc < 0) goto fallback;
        if (rc == 1) continue;
        q->index = i;
        PyObject *model = PyTuple_GET_ITEM(models, i);
        if (get_ssize(model, s_max_batch, &q->max_batch) < 0 || q->max_batch < 1) goto fallback;
        q->by_batch = PyObject_GetAttr(model, s_by_batch);
        if (q->by_batch == NULL) goto fallback;
        count++; /* from here on the clean-up releases its table */
        Py_ssize_t cap = batch_cap ? batch_cap : q->max_batch;
        q->size = q->max_batch < cap ? q->max_batch : cap; /* the look-ahead's batches */
        q->batch = q->n < q->size ? q->n : q->size;
        tasks += q->n;
        mixed |= !q->uniform;
        if (q->n_runs > most_runs) most_runs = q->n_runs;
    }
    /* fast_scoring.fast_candidates' choice of scorer: the three this file computes, or Python */
    int deep = 0, loop = 0;
    if (count == 0) goto fallback;
    if (mixed) {
        if (tasks * count <= small_loop) {
            if (tasks > MAX_TASKS) goto fallback;
            loop = 1; /* reference_candidates' per-task loop */
        } else if (most_runs <= max_runs && max_runs <= MAX_RUNS) {
            deep = 1; /* a few runs of one budget per queue: scoring_deep, run by run */
        } else {
            goto fallback; /* budgets interleaved: numpy's matrix */
        }
    } else if (tasks + 3 * count * count > small_state) {
        deep = 1; /* scoring_deep: the sums the queues keep */
    } else if (tasks > MAX_TASKS) {
        goto fallback;
    }
    for (Py_ssize_t i = 0, at = 0; i < count; i++) {
        Live *q = &live[i];
        if (deep) {
            if (deep_refresh(q, now, theta, dominance, pivot_span, lookahead) < 0) goto fallback;
            continue;
        }
        q->neg_ys = ys + at;
        if (get_item(q->queue, s_arrival, q->head, q->n, q->neg_ys) < 0) goto fallback;
        if (loop ? read_loop(q, now, lookahead, budgets + at, deadlines + at) < 0
                  : factorise(q, now, theta, code, sums + used) < 0)
            goto fallback;
        used += q->n - q->k + 1;
        at += q->n;
    }

    /* choose_exits(rule="safe") */
    double spares[MAX_QUEUES];
    for (Py_ssize_t i = 0; i < count; i++) {
        double shallowest;
        if (table(live[i].by_batch, live[i].batch - 1, 0, &shallowest) < 0) goto fallback;
        spares[i] = live[i].slack - shallowest;
        if (deepest_feasible(live[i].by_batch, live[i].batch, live[i].slack, &live[i].paper) < 0) goto fallback;
    }
    int any_safe = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Live *q = &live[i];
        double shallowest, limit = q->slack, value;
        table(q->by_batch, q->batch - 1, 0, &shallowest);
        for (Py_ssize_t j = 0; j < count; j++)
            if (shallowest <= spares[j] && spares[j] < limit && j != i) limit = spares[j];
        Py_ssize_t pos = n_exits(q->by_batch, q->batch - 1) - 1;
        while (pos >= 0 && (table(q->by_batch, q->batch - 1, pos, &value), value > limit)) pos--;
        q->protective = pos >= 0 ? pos : q->paper;
        any_safe |= q->paper <= q->protective;
    }

    /* the candidates' scores (python_candidates, or reference_candidates' loop), then pick_min over
     * the eligible */
    const double e1 = M_E - 1.0;
    Py_ssize_t pool[MAX_QUEUES], n_pool = 0;
    double largest = 0.0;
    for (Py_ssize_t c = 0; c < count; c++) {
        Live *m = &live[c];
        m->exit = any_safe ? m->paper : m->protective;
        if (!any_safe || m->paper <= m->protective) pool[n_pool++] = c;
        table(m->by_batch, m->batch - 1, m->exit, &m->delta);
        if (c == 0 || m->delta > largest) largest = m->delta;
    }
    for (Py_ssize_t j = 0; deep && j < count; j++) { /* every candidate's clipped prefix lies in [k0, k1] */
        Live *q = &live[j];
        for (Py_ssize_t i = 0; i < q->n_runs; i++) {
            Run *r = &q->runs[i];
            r->k1 = first_above(q->arr, r->k0, r->stop, now, r->budget, largest / r->budget - theta);
        }
    }
    for (Py_ssize_t c = 0; c < count; c++) {
        Live *m = &live[c];
        double score = 0.0;
        for (Py_ssize_t j = 0; loop && j < count; j++) {
            const Live *q = &live[j];
            const double *arrivals = q->neg_ys; /* not factorised: still the arrivals */
            for (Py_ssize_t k = j == c ? m->batch : 0; k < q->n; k++)
                score += urgency((now - arrivals[k] + m->delta) / q->budgets[k], theta, clip, code);
        }
        Py_ssize_t mine = m->head + m->batch; /* the served batch: the queue's first tasks */
        for (Py_ssize_t j = 0; deep && j < count; j++) { /* scoring_deep.deep_candidates, run by run */
            const Live *q = &live[j];
            for (Py_ssize_t i = 0; i < q->n_runs; i++) {
                const Run *r = &q->runs[i];
                double shift = m->delta / r->budget;
                Py_ssize_t clipped = first_above(q->arr, r->k0, r->k1, now, r->budget, shift - theta);
                Py_ssize_t served = j == c && mine > r->start ? (mine < r->stop ? mine : r->stop) : r->start, first;
                if (clipped > served) {
                    score += clip * (double)(clipped - served);
                    first = clipped;
                } else {
                    first = served;
                }
                if (first >= r->stop) continue;
                double pre_hi = 0.0, pre_lo = 0.0;
                if (first > r->anchor) {
                    pre_hi = q->hi[first - 1];
                    pre_lo = q->lo[first - 1];
                }
                double total = (q->hi[r->stop - 1] - pre_hi) + (q->lo[r->stop - 1] - pre_lo);
                if (code)
                    score += exp(r->cexp + shift - 1.0) * total;
                else
                    score += (exp(r->cexp + shift) * total - (double)(r->stop - first)) / e1;
            }
        }
        for (Py_ssize_t j = 0; !loop && !deep && j < count; j++) {
            Live *q = &live[j];
            double shift = m->delta / q->budget;
            Py_ssize_t clipped = bisect_right(q->neg_ys, q->n, shift - theta);
            Py_ssize_t served = j == c ? m->batch : 0, first;
            if (clipped > served) {
                score += clip * (double)(clipped - served);
                first = clipped;
            } else {
                first = served;
            }
            if (first >= q->n) continue;
            if (code)
                score += exp(shift) * q->suffix[first - q->k];
            else
                score += (exp(shift) * q->suffix[first - q->k] + (double)(q->n - first) * expm1(shift)) / e1;
        }
        m->score = score;
    }
    double best = live[pool[0]].score;
    for (Py_ssize_t i = 1; i < n_pool; i++)
        if (live[pool[i]].score < best) best = live[pool[i]].score;
    Live *pick = NULL;
    for (Py_ssize_t i = 0; i < n_pool && pick == NULL; i++) {
        double s = live[pool[i]].score;
        if (isinf(best) || isnan(best)) {
            if (s == best || (isnan(best) && isnan(s))) pick = &live[pool[i]];
        } else if (s <= best + tie_rtol * fabs(best)) {
            pick = &live[pool[i]];
        }
    }
    if (pick == NULL) goto fallback;

    /* guarded.none_doomed: the guard keeps the pick without a look-ahead; else it looks further */
    Move move = move_of(pick);
    if (count > 1) {
        double end = now + pick->delta, tightest = INFINITY;
        for (Py_ssize_t i = 0; i < count; i++) {
            Live *q = &live[i];
            Py_ssize_t size = q->size, n = q->n < size * lookahead ? q->n : size * lookahead;
            Py_ssize_t full = n / size, rest = n % size;
            double whole, part = 0.0;
            if (table(q->by_batch, size - 1, 0, &whole) < 0) goto fallback;
            if (rest && table(q->by_batch, rest - 1, 0, &part) < 0) goto fallback;
            end += (double)full * whole + part;
            if (q->head_deadline < tightest) tightest = q->head_deadline;
        }
        if (!(tightest > end + margin) && guard(live, count, pick, now, lookahead, &move) < 0) goto fallback;
    }

    /* GuardedStabilityPolicy.decide: the batch rule, then the Dispatch's exit id */
    PyObject *model = PyTuple_GET_ITEM(models, move.index);
    if (split && move.batch > 1) {
        const Live *q = live;
        while (q->index != move.index) q++; /* the move serves a live queue */
        move.batch = batch_for(model, move.batch == tasks ? s_alone_splits : s_splits, move.batch, move.exit);
        if (move.batch < 0 || table(q->by_batch, move.batch - 1, move.exit, &move.delta) < 0) goto fallback;
    }
    PyObject *exit_ids = PyObject_GetAttr(model, s_exit_ids);
    if (exit_ids == NULL) goto fallback;
    if (PyTuple_Check(exit_ids) && move.exit < PyTuple_GET_SIZE(exit_ids))
        result = Py_BuildValue("nOndd", move.index, PyTuple_GET_ITEM(exit_ids, move.exit), move.batch, move.delta,
                               move.score);
    Py_DECREF(exit_ids);
    if (result == NULL) goto fallback;
    goto done;

fallback:
    if (PyErr_Occurred()) PyErr_Clear(); /* an unexpected shape: the Python path decides (and says why) */
    result = Py_None;
    Py_INCREF(result);
done:
    for (Py_ssize_t i = 0; i < count; i++) {
        for (int v = 0; v < live[i].n_views; v++) PyBuffer_Release(&live[i].views[v]);
        Py_DECREF(live[i].by_batch);
    }
    return result;
}

static PyMethodDef methods[] = {
    {"decide", decide, METH_VARARGS,
     "The default policy's usual decision (budgets mixed only in a few runs per queue, or a small state):\n"
     "(model, exit_id, batch, predicted_s, score), a Dispatch's fields, or None for the Python path."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_quick", NULL, -1, methods};

PyMODINIT_FUNC PyInit__quick(void) {
    s_head = PyUnicode_InternFromString("_head");
    s_tail = PyUnicode_InternFromString("_tail");
    s_arrival = PyUnicode_InternFromString("_arrival");
    s_budget = PyUnicode_InternFromString("_budget");
    s_deadline = PyUnicode_InternFromString("_deadline");
    s_run_head = PyUnicode_InternFromString("_run_head");
    s_run_tail = PyUnicode_InternFromString("_run_tail");
    s_runs = PyUnicode_InternFromString("_runs");
    s_max_batch = PyUnicode_InternFromString("max_batch");
    s_by_batch = PyUnicode_InternFromString("by_batch");
    s_exit_ids = PyUnicode_InternFromString("exit_ids");
    s_splits = PyUnicode_InternFromString("splits");
    s_alone_splits = PyUnicode_InternFromString("alone_splits");
    s_hi = PyUnicode_InternFromString("_hi");
    s_lo = PyUnicode_InternFromString("_lo");
    if (!s_head || !s_tail || !s_arrival || !s_budget || !s_deadline || !s_run_head || !s_run_tail || !s_runs ||
        !s_max_batch || !s_by_batch || !s_exit_ids || !s_splits || !s_alone_splits || !s_hi || !s_lo)
        return NULL;
    return PyModule_Create(&module);
}
