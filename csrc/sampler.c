/*
 * Flow-matching samplers, operation for operation as diffusers 0.42.1 computes
 * them, so that a render at matched noise follows diffusers' WanPipeline:
 *
 *   H3R_SAMPLER_EULER  FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000,
 *                      shift=shift)
 *   H3R_SAMPLER_UNIPC  UniPCMultistepScheduler(prediction_type="flow_prediction",
 *                      use_flow_sigmas=True, flow_shift=shift, num_train_timesteps=1000,
 *                      solver_order=2, solver_type="bh2", predict_x0=True,
 *                      lower_order_final=True, final_sigmas_type="zero",
 *                      disable_corrector=[]), the config Wan 2.1 ships.
 *
 * Precision follows diffusers exactly: where it computes with numpy float64 we
 * use double, where it computes with float32 torch tensors (the __init__
 * schedule of Euler, every scalar of a UniPC step, every latent update) we use
 * float, in the same order of operations (the build has -ffp-contract=off, so
 * no fused multiply-adds). docs/ENGINE.md writes the formulas out.
 *
 * Shapes: n is the latent element count; x, v, history buffers are (n,).
 *
 * Exported: h3r_schedule (ABI) and h3r_test_sampler_run (tests only, not
 * stable ABI). Internal: sampler_* from models.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models.h"

#define NUM_TRAIN_TIMESTEPS 1000 /* both schedulers' num_train_timesteps */
#define MAX_STEPS 10000          /* sanity bound on the step count */
#define UNIPC_FIRST_EPS 1e-6     /* diffusers moves sigma 1.0 to 1 - 1e-6 */

struct h3r_sampler {
    int kind;          /* H3R_SAMPLER_* */
    int steps;
    int64_t n;         /* latent element count */
    int next;          /* step index sampler_step expects next */
    float *sigmas;     /* (steps + 1,) */
    float *timesteps;  /* (steps,) */
    /* UniPC state (NULL for Euler). m_* are converted model outputs (x0
     * predictions): m_last from the previous step, m_prev from the one before. */
    float *m_last;     /* (n,) */
    float *m_prev;     /* (n,) */
    float *m_new;      /* (n,) scratch for this step's conversion */
    float *last_sample;/* (n,) sample the previous predictor started from */
    int this_order;    /* order of the previous predictor, used by the corrector */
    int lower_order_nums;
};

/* ---------------------------------------------------------------- schedules */

/* The double a Python caller most plausibly meant by this float: the shortest
 * decimal that rounds to f, read back as double (3.3f -> 3.3, not 3.2999999523).
 * diffusers receives the shift as a Python float; this keeps the float ABI
 * from perturbing non-representable shifts. */
static double shift_as_double(float f) {
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        double d = strtod(buf, NULL);
        if ((float)d == f) return d;
    }
    return (double)f;
}

/* numpy.linspace(start, stop, num)[i] in float64:
 *   step = (stop - start) / (num - 1);  y_i = i * step + start;  y_last = stop. */
static double np_linspace_at(double start, double stop, int num, int i) {
    if (num <= 1) return start;       /* numpy: y = [0 * delta] + start */
    if (i == num - 1) return stop;
    double step = (stop - start) / (double)(num - 1);
    return (double)i * step + start;
}

/* FlowMatchEulerDiscreteScheduler(shift).set_timesteps(steps):
 *   __init__ (float32): s = t/1000 for t = 1000..1, s = shift*s / (1 + (shift-1)*s);
 *                       sigma_max = s(1000), sigma_min = s(1)
 *   set_timesteps (float64): ts = linspace(sigma_max*1000, sigma_min*1000, steps),
 *                       s = ts/1000, s = shift*s / (1 + (shift-1)*s)   (shifted again)
 *   sigmas = float32(s) ++ [0];  timesteps = sigmas[:-1] * 1000 (float32). */
static void schedule_euler(int steps, double shift, float *sigmas, float *timesteps) {
    const float shift_f = (float)shift, shm1_f = (float)(shift - 1.0);
    const float N = (float)NUM_TRAIN_TIMESTEPS;
    float s_hi = (float)NUM_TRAIN_TIMESTEPS / N, s_lo = 1.0f / N;
    s_hi = (shift_f * s_hi) / (1.0f + shm1_f * s_hi);
    s_lo = (shift_f * s_lo) / (1.0f + shm1_f * s_lo);
    double t_max = (double)s_hi * NUM_TRAIN_TIMESTEPS, t_min = (double)s_lo * NUM_TRAIN_TIMESTEPS;
    for (int i = 0; i < steps; i++) {
        double s = np_linspace_at(t_max, t_min, steps, i) / NUM_TRAIN_TIMESTEPS;
        s = shift * s / (1.0 + (shift - 1.0) * s);
        sigmas[i] = (float)s;
        timesteps[i] = sigmas[i] * N;
    }
    sigmas[steps] = 0.0f;
}

/* UniPCMultistepScheduler(use_flow_sigmas, flow_shift).set_timesteps(steps), float64:
 *   s = linspace(1, 1/1000, steps + 1)[:-1];  s = shift*s / (1 + (shift-1)*s)
 *   if |s[0] - 1| < 1e-6: s[0] -= 1e-6
 *   timesteps = int64(s * 1000)   (truncation: the DiT sees integer timesteps)
 *   sigmas = float32(s) ++ [0]. */
static void schedule_unipc(int steps, double shift, float *sigmas, float *timesteps) {
    for (int i = 0; i < steps; i++) {
        double s = np_linspace_at(1.0, 1.0 / NUM_TRAIN_TIMESTEPS, steps + 1, i);
        s = shift * s / (1.0 + (shift - 1.0) * s);
        if (i == 0 && fabs(s - 1.0) < UNIPC_FIRST_EPS) s -= UNIPC_FIRST_EPS;
        sigmas[i] = (float)s;
        timesteps[i] = (float)(int64_t)(s * NUM_TRAIN_TIMESTEPS);
    }
    sigmas[steps] = 0.0f;
}

/* Validate (sampler, steps, shift); 0 or a negative code naming the field. */
static int check_schedule_args(int kind, int steps, float shift) {
    if (kind != H3R_SAMPLER_UNIPC && kind != H3R_SAMPLER_EULER)
        return h3r_seterr(H3R_ERR_INVALID, "sampler=%d is not supported; allowed: %d (unipc), "
                          "%d (euler)", kind, H3R_SAMPLER_UNIPC, H3R_SAMPLER_EULER);
    if (steps < 1 || steps > MAX_STEPS)
        return h3r_seterr(H3R_ERR_INVALID, "steps=%d is out of range; allowed: 1..%d",
                          steps, MAX_STEPS);
    if (!(shift > 0.0f) || !isfinite(shift))
        return h3r_seterr(H3R_ERR_INVALID, "shift=%g is invalid; allowed: a finite value > 0",
                          (double)shift);
    return 0;
}

/* Sigmas (steps+1,) and model timesteps (steps,) of a sampler, as diffusers'
 * scheduler holds them after set_timesteps(steps). Returns 0, or
 * H3R_ERR_INVALID naming the bad argument. Writes only the two arrays. */
H3R_API int h3r_schedule(int sampler, int steps, float shift, float *sigmas, float *timesteps) {
    int rc = check_schedule_args(sampler, steps, shift);
    if (rc) return rc;
    if (!sigmas || !timesteps)
        return h3r_seterr(H3R_ERR_INVALID, "h3r_schedule: sigmas and timesteps must not be NULL");
    double sh = shift_as_double(shift);
    if (sampler == H3R_SAMPLER_EULER) schedule_euler(steps, sh, sigmas, timesteps);
    else schedule_unipc(steps, sh, sigmas, timesteps);
    return 0;
}

/* ---------------------------------------------------------------- sampler */

/* Latent-sized (n,) buffers a sampler keeps for its whole run: UniPC's
 * m_last, m_prev, m_new and last_sample; none for Euler. */
int sampler_history_buffers(int kind) { return kind == H3R_SAMPLER_UNIPC ? 4 : 0; }

int64_t sampler_bytes(int kind, int steps, int64_t n) {
    return (int64_t)sizeof(h3r_sampler) + (2 * (int64_t)steps + 1) * (int64_t)sizeof(float) +
           sampler_history_buffers(kind) * n * (int64_t)sizeof(float);
}

/* Make a sampler for `steps` steps over latents of n elements. On success
 * *out owns its schedule and (UniPC) four (n,) history buffers; returns 0.
 * On failure *out is NULL and a negative code is returned. */
int sampler_create(int kind, int steps, float shift, int64_t n, h3r_sampler **out) {
    *out = NULL;
    int rc = check_schedule_args(kind, steps, shift);
    if (rc) return rc;
    if (n < 1 || (uint64_t)n > SIZE_MAX / (4 * sizeof(float)))
        return h3r_seterr(H3R_ERR_INVALID, "sampler: latent element count n=%lld is out of range",
                          (long long)n);
    h3r_sampler *s = calloc(1, sizeof *s);
    if (!s) return h3r_seterr(H3R_ERR_NOMEM, "sampler: out of memory");
    s->kind = kind;
    s->steps = steps;
    s->n = n;
    s->sigmas = malloc((size_t)(steps + 1) * sizeof(float));
    s->timesteps = malloc((size_t)steps * sizeof(float));
    if (!s->sigmas || !s->timesteps) goto nomem;
    h3r_schedule(kind, steps, shift, s->sigmas, s->timesteps);
    float **history[4] = {&s->m_last, &s->m_prev, &s->m_new, &s->last_sample};
    for (int i = 0; i < sampler_history_buffers(kind); i++)
        if (!(*history[i] = malloc((size_t)n * sizeof(float)))) goto nomem;
    *out = s;
    return 0;
nomem:
    sampler_free(s);
    return h3r_seterr(H3R_ERR_NOMEM, "sampler: out of memory for %lld latent elements",
                      (long long)n);
}

void sampler_free(h3r_sampler *s) {
    if (!s) return;
    free(s->sigmas);
    free(s->timesteps);
    free(s->m_last);
    free(s->m_prev);
    free(s->m_new);
    free(s->last_sample);
    free(s);
}

const float *sampler_sigmas(const h3r_sampler *s) { return s->sigmas; }
const float *sampler_timesteps(const h3r_sampler *s) { return s->timesteps; }

/* Euler: x += (sigma[i+1] - sigma[i]) * v, in float32. */
static void euler_step(const h3r_sampler *s, int i, const float *v, float *x) {
    const float dt = s->sigmas[i + 1] - s->sigmas[i];
    for (int64_t j = 0; j < s->n; j++) x[j] = x[j] + dt * v[j];
}

/* Flow sigmas to UniPC's lambda = log(alpha) - log(sigma), alpha = 1 - sigma,
 * in float32 (sigma 0 gives +inf, as in torch). */
static float unipc_lambda(float sigma) {
    float alpha = 1.0f - sigma;
    return logf(alpha) - logf(sigma);
}

/* Solve the 2x2 system [[1, 1], [rk, 1]] rho = (b0, b1) in float32 the way
 * torch.linalg.solve does on x86 (MKL sgesv): LU with partial pivoting, the
 * multiplier and both back-substitution divisions done as multiplications by
 * the pivot's reciprocal. Checked bit-exact against torch 2.13 on 2000 random
 * systems; another LAPACK may differ in the last bit. */
static void solve2_lapack(float rk, float b0, float b1, float rho[2]) {
    float a00 = 1.0f, a01 = 1.0f, a10 = rk, a11 = 1.0f;
    float y0 = b0, y1 = b1;
    if (fabsf(a10) > fabsf(a00)) {
        float t;
        t = a00; a00 = a10; a10 = t;
        t = a01; a01 = a11; a11 = t;
        t = y0; y0 = y1; y1 = t;
    }
    float l = a10 * (1.0f / a00);
    float u11 = a11 - l * a01;
    y1 = y1 - y0 * l;
    float x1 = y1 * (1.0f / u11);
    y0 = y0 - x1 * a01;
    float x0 = y0 * (1.0f / a00);
    rho[0] = x0;
    rho[1] = x1;
}

/* Scalars shared by UniPC's predictor and corrector for a step from sigma s0
 * to sigma t (diffusers: multistep_uni_{p,c}_bh_update, predict_x0, bh2). */
typedef struct {
    float c_x;     /* sigma_t / sigma_s0 */
    float c_m0;    /* alpha_t * h_phi_1 */
    float c_res;   /* alpha_t * B_h */
    float rk;      /* (lambda_s1 - lambda_s0) / h, order 2 only */
    float b[2];    /* b_1, b_2 of the order conditions */
} unipc_coef;

static unipc_coef unipc_coefs(float sig_t, float sig_s0, float sig_s1, int order) {
    unipc_coef c = {0};
    float alpha_t = 1.0f - sig_t;
    float lambda_t = unipc_lambda(sig_t), lambda_s0 = unipc_lambda(sig_s0);
    float h = lambda_t - lambda_s0;
    if (order >= 2) c.rk = (unipc_lambda(sig_s1) - lambda_s0) / h;
    float hh = -h;
    float h_phi_1 = expm1f(hh);
    float h_phi_k = h_phi_1 / hh - 1.0f;
    float B_h = expm1f(hh);
    float factorial = 1.0f;
    for (int i = 1; i <= order && i <= 2; i++) {
        c.b[i - 1] = h_phi_k * factorial / B_h;
        factorial *= (float)(i + 1);
        h_phi_k = h_phi_k / hh - (float)(1.0 / (double)factorial);
    }
    c.c_x = sig_t / sig_s0;
    c.c_m0 = alpha_t * h_phi_1;
    c.c_res = alpha_t * B_h;
    return c;
}

/* UniC corrector, in place on x (the sample this step started from):
 *   x = c_x*last - c_m0*m_last - c_res*(rho_0 * (m_prev - m_last)/rk + rho_1*(m_new - m_last))
 * with rho = 0.5 for order 1 and the 2x2 solve for order 2. */
static void unipc_correct(h3r_sampler *s, int i, float *x) {
    const int order = s->this_order;
    const float sig_s1 = order >= 2 ? s->sigmas[i - 2] : 0.0f;
    unipc_coef c = unipc_coefs(s->sigmas[i], s->sigmas[i - 1], sig_s1, order);
    const float *last = s->last_sample, *m0 = s->m_last, *m1 = s->m_prev, *mt = s->m_new;
    if (order == 1) {
        const float rho = 0.5f;
        for (int64_t j = 0; j < s->n; j++) {
            float xt_ = c.c_x * last[j] - c.c_m0 * m0[j];
            float d1t = mt[j] - m0[j];
            x[j] = xt_ - c.c_res * (rho * d1t);
        }
    } else {
        float rho[2];
        solve2_lapack(c.rk, c.b[0], c.b[1], rho);
        for (int64_t j = 0; j < s->n; j++) {
            float xt_ = c.c_x * last[j] - c.c_m0 * m0[j];
            float corr = rho[0] * ((m1[j] - m0[j]) / c.rk);
            float d1t = mt[j] - m0[j];
            x[j] = xt_ - c.c_res * (corr + rho[1] * d1t);
        }
    }
}

/* UniP predictor from sigma[i] to sigma[i+1], in place on x, with m_last the
 * x0 prediction of this step and m_prev that of the step before:
 *   x = c_x*x - c_m0*m_last - c_res*(0.5 * (m_prev - m_last)/rk)   (order 2)
 *   x = c_x*x - c_m0*m_last                                        (order 1) */
static void unipc_predict(h3r_sampler *s, int i, int order, float *x) {
    const float sig_s1 = order >= 2 ? s->sigmas[i - 1] : 0.0f;
    unipc_coef c = unipc_coefs(s->sigmas[i + 1], s->sigmas[i], sig_s1, order);
    const float *m0 = s->m_last, *m1 = s->m_prev;
    if (order == 1) {
        for (int64_t j = 0; j < s->n; j++) x[j] = c.c_x * x[j] - c.c_m0 * m0[j];
    } else {
        const float rho = 0.5f;
        for (int64_t j = 0; j < s->n; j++) {
            float xt_ = c.c_x * x[j] - c.c_m0 * m0[j];
            float pred = rho * ((m1[j] - m0[j]) / c.rk);
            x[j] = xt_ - c.c_res * pred;
        }
    }
}

/* One UniPCMultistepScheduler.step (diffusers order of operations):
 *   m = x - sigma_i * v                      (flow_prediction -> x0)
 *   if i > 0: x = corrector(x) with the previous step's order
 *   history <- m;  order = min(2, steps - i, lower_order_nums + 1)
 *   last_sample = x;  x = predictor(x, order) */
static void unipc_step(h3r_sampler *s, int i, const float *v, float *x) {
    const float sig = s->sigmas[i];
    for (int64_t j = 0; j < s->n; j++) s->m_new[j] = x[j] - sig * v[j];
    if (i > 0) unipc_correct(s, i, x);
    float *t = s->m_prev;      /* rotate: prev <- last <- new; old prev becomes scratch */
    s->m_prev = s->m_last;
    s->m_last = s->m_new;
    s->m_new = t;
    int order = s->steps - i < 2 ? s->steps - i : 2;            /* lower_order_final */
    if (order > s->lower_order_nums + 1) order = s->lower_order_nums + 1; /* warm-up */
    s->this_order = order;
    memcpy(s->last_sample, x, (size_t)s->n * sizeof(float));
    unipc_predict(s, i, order, x);
    if (s->lower_order_nums < 2) s->lower_order_nums++;
}

/* Advance x (n,) in place by step step_index given the model's flow prediction
 * v (n,). Steps must come in order 0, 1, ..., steps-1 (UniPC keeps history).
 * Returns 0, or H3R_ERR_INVALID if the index is out of order. */
int sampler_step(h3r_sampler *s, int step_index, const float *v, float *x) {
    if (step_index != s->next || step_index >= s->steps)
        return h3r_seterr(H3R_ERR_INVALID, "sampler_step: step_index=%d, expected %d of %d steps",
                          step_index, s->next, s->steps);
    if (s->kind == H3R_SAMPLER_EULER) euler_step(s, step_index, v, x);
    else unipc_step(s, step_index, v, x);
    s->next++;
    return 0;
}

/* ---------------------------------------------------------------- test entry */

/* Test entry point, NOT stable ABI (tests/test_sampler.py): run a whole
 * denoising loop with recorded model outputs.
 *   x0 (n,) initial latents; vs (steps, n) the flow prediction fed at each
 *   step; xs (steps, n) receives x after each step.
 * Returns 0 or a negative code (bad arguments, out of memory). */
H3R_API int h3r_test_sampler_run(int sampler, int steps, float shift, int64_t n,
                                 const float *x0, const float *vs, float *xs);
H3R_API int h3r_test_sampler_run(int sampler, int steps, float shift, int64_t n,
                                 const float *x0, const float *vs, float *xs) {
    if (!x0 || !vs || !xs)
        return h3r_seterr(H3R_ERR_INVALID, "h3r_test_sampler_run: NULL array argument");
    h3r_sampler *s;
    int rc = sampler_create(sampler, steps, shift, n, &s);
    if (rc) return rc;
    float *x = malloc((size_t)n * sizeof(float));
    if (!x) {
        sampler_free(s);
        return h3r_seterr(H3R_ERR_NOMEM, "h3r_test_sampler_run: out of memory");
    }
    memcpy(x, x0, (size_t)n * sizeof(float));
    for (int i = 0; i < steps && rc == 0; i++) {
        rc = sampler_step(s, i, vs + (size_t)i * (size_t)n, x);
        if (rc == 0) memcpy(xs + (size_t)i * (size_t)n, x, (size_t)n * sizeof(float));
    }
    free(x);
    sampler_free(s);
    return rc;
}
