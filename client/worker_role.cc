#include "client/worker_role.h"
