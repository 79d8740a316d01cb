/* kv_calibration.h - the text an FP8 KV cache's scales are measured on when a
 * checkpoint has none (lm_kv_scales_measure): prose, a chat's markup, code,
 * numbers and other scripts, so that the keys' and values' large entries of
 * ordinary traffic are seen. Changing it changes the measured scales. */
#ifndef VLMD_KV_CALIBRATION_H
#define VLMD_KV_CALIBRATION_H

static const char kv_calibration_text[] =
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "Summarise the following report in three sentences, then list its numbers.<|im_end|>\n"
    "<|im_start|>assistant\nThe committee met on Tuesday to review the budget for the coming "
    "year. Spending on public transport rose by 12.5 percent, while the parks department asked "
    "for 3 new gardeners and 40,000 euros to repair the old greenhouse. The chair closed the "
    "meeting at 18:45 and promised a decision before the end of March.\n"
    "Numbers: 12.5, 3, 40000, 18:45, 2026, 0.001, -7, 1e9, 3.14159, 65535.<|im_end|>\n"
    "def merge(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
    "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n"
    "SELECT name, count(*) FROM orders WHERE total > 100 GROUP BY name ORDER BY 2 DESC;\n"
    "{\"city\": \"Paris\", \"days\": 2, \"units\": \"metric\", \"tags\": [\"rain\", null]}\n"
    "Le chat dort sur le canap\xc3\xa9 pendant que la pluie tombe. "
    "Der schnelle braune Fuchs springt \xc3\xbc" "ber den faulen Hund. "
    "\xe4\xbb\x8a\xe5\xa4\xa9\xe5\xa4\xa9\xe6\xb0\x94\xe5\xbe\x88\xe5\xa5\xbd\xe3\x80\x82"
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87\xe7\xab\xa0\xe3\x80\x82 "
    "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, \xd0\xbc\xd0\xb8\xd1\x80! "
    "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xd8\xa8\xd8\xa7\xd9\x84\xd8\xb9\xd8\xa7\xd9\x84"
    "\xd9\x85. \xf0\x9f\x99\x82\xf0\x9f\x9a\x80\n"
    "Once upon a time, in a village by the sea, an old sailor taught the children to read "
    "the stars. Every night they climbed the hill behind the church, counted the lights of "
    "the ships and wrote down where the moon rose, until the winter storms came.\n";

#endif
