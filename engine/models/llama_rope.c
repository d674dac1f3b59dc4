/* The Llama family's rotary embedding tables: Hugging Face's inverse frequencies, with its
 * "linear" and "llama3" rope_scaling, turned into the cos/sin tables the rope op reads. Computed
 * once at model creation: frequencies in double precision, angles in fp32 as Hugging Face's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

void zt_llama_rope_inv_freq(const zt_model_spec *s, int head_dim, double *inv_freq) {
    const int half = head_dim / 2;
    for (int j = 0; j < half; j++)
        inv_freq[j] = 1.0 / pow(s->rope_theta, 2.0 * j / head_dim);
    if (strcmp(s->rope_scaling, "linear") == 0) {
        /* Positions are divided by the factor, which is the same as the frequencies. */
        for (int j = 0; j < half; j++)
            inv_freq[j] /= s->rope_factor;
    } else if (strcmp(s->rope_scaling, "llama3") == 0) {
        /* Llama 3.1's scaling (Hugging Face's _compute_llama3_parameters): wavelengths longer
         * than the original context / low_freq_factor are stretched by the factor, those shorter
         * than original context / high_freq_factor are kept, and the band between is a linear
         * blend of the two, weighted by where the wavelength falls in the band. */
        const double orig = s->rope_original_max_position;
        const double low = s->rope_low_freq_factor, high = s->rope_high_freq_factor;
        const double low_freq_wavelen = orig / low, high_freq_wavelen = orig / high;
        for (int j = 0; j < half; j++) {
            const double wavelen = 2.0 * M_PI / inv_freq[j];
            double f = wavelen > low_freq_wavelen ? inv_freq[j] / s->rope_factor : inv_freq[j];
            if (!(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen)) {
                const double smooth = (orig / wavelen - low) / (high - low);
                f = (1.0 - smooth) * f / s->rope_factor + smooth * f;
            }
            inv_freq[j] = f;
        }
    }
}

zt_status zt_llama_rope_tables(const zt_model_spec *s, int head_dim, int T, float *cos_t,
                               float *sin_t) {
    const int half = head_dim / 2;
    double *inv_freq = malloc((size_t)half * sizeof *inv_freq);
    if (!inv_freq)
        return zt_error(ZT_ERR_NOMEM, "%s: out of memory for the rotary tables", s->type);
    zt_llama_rope_inv_freq(s, head_dim, inv_freq);
    /* The angle is the fp32 product of an fp32 frequency and the position, as Hugging Face
     * (and Meta's reference) compute it: at position 8192 its rounding is worth up to 5e-4
     * radians, and a model trained with those tables expects them. Its cosine and sine are then
     * taken exactly and rounded. */
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < half; j++) {
            const float angle = (float)inv_freq[j] * (float)t;
            cos_t[(size_t)t * half + j] = (float)cos((double)angle);
            sin_t[(size_t)t * half + j] = (float)sin((double)angle);
        }
    }
    free(inv_freq);
    return ZT_OK;
}
