/* UTF-8 decoding and the code point classes the byte-level BPE pre-tokenizers split on
 * (table generated from Debian's unicode-data by scripts/gen-unicode-table.py). */
#ifndef KVP_UNICODE_H
#define KVP_UNICODE_H

#include <stddef.h>
#include <stdint.h>

enum kvp_ucls {
    KVP_UCLS_OTHER = 0,   /* punctuation, symbols, marks, controls, invalid bytes */
    KVP_UCLS_LETTER = 1,  /* \p{L}: Lu Ll Lt Lm Lo */
    KVP_UCLS_NUMBER = 2,  /* \p{N}: Nd Nl No */
    KVP_UCLS_SPACE = 3,   /* \s: the White_Space property */
};

/* General categories, for the pre-tokenizers whose regexes name them. */
enum kvp_ugc {
    KVP_UGC_OTHER = 0,    /* Z*, C*, unassigned, invalid bytes */
    KVP_UGC_LU = 1,       /* \p{Lu} upper case letter */
    KVP_UGC_LL = 2,       /* \p{Ll} lower case letter */
    KVP_UGC_LT = 3,       /* \p{Lt} title case letter */
    KVP_UGC_LM = 4,       /* \p{Lm} modifier letter */
    KVP_UGC_LO = 5,       /* \p{Lo} other letter */
    KVP_UGC_MARK = 6,     /* \p{M}: Mn Mc Me */
    KVP_UGC_NUMBER = 7,   /* \p{N}: Nd Nl No */
    KVP_UGC_PUNCT = 8,    /* \p{P}: Pc Pd Ps Pe Pi Pf Po */
    KVP_UGC_SYMBOL = 9,   /* \p{S}: Sm Sc Sk So */
};

/* Length of the UTF-8 sequence at s (n >= 1 bytes left) and its code point in *cp;
 * an invalid or truncated sequence is 1 byte with *cp = 0xFFFD. */
size_t kvp_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Class of a code point. */
enum kvp_ucls kvp_unicode_class(uint32_t cp);
/* General category of a code point. */
enum kvp_ugc kvp_unicode_gc(uint32_t cp);
/* Full case mappings (Unicode's SpecialCasing without its conditions, else the simple
 * mapping): writes the 1 to 3 code points cp maps to into out, returns the count. */
enum kvp_ucase { KVP_UCASE_LOWER = 0, KVP_UCASE_UPPER = 1, KVP_UCASE_TITLE = 2 };
int kvp_unicode_case(uint32_t cp, enum kvp_ucase which, uint32_t out[3]);
/* Unicode's Cased and Case_Ignorable properties (which Final_Sigma and title casing use). */
int kvp_unicode_is_cased(uint32_t cp);
int kvp_unicode_is_case_ignorable(uint32_t cp);
/* Writes cp (<= 0x10FFFF) as UTF-8 into out (4 bytes); returns the length. */
size_t kvp_utf8_encode(uint32_t cp, char *out);
/* Unicode Normalization Form C of len bytes into *out (malloc'd, at most 4 * len bytes,
 * *out_len of them). Invalid UTF-8 bytes pass through unchanged and
 * block composition across them. Returns 0 or -ENOMEM / -E2BIG. */
int kvp_nfc(const char *in, size_t len, char **out, size_t *out_len);

#endif
