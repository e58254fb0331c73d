/* topolet C helper: include this from C; topolet_api.h is the part cffi also reads. */
#ifndef TOPOLET_H
#define TOPOLET_H

#include <stddef.h>
#include <stdint.h>

#include "topolet_api.h"

#endif
