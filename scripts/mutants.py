"""The mutation check's list (run by scripts/mutate.py): each mutant is one promise the product prints, broken.

Every mutant names a file, a function in it, an exact source snippet (found exactly once inside that function),
its replacement and the tests that must kill it (pytest arguments, grouped below by what they check). A mutant
whose survival is expected carries the reason (``equivalent``), as docs/DESIGN.md ("Mutation check") explains.
"""
from __future__ import annotations

from dataclasses import dataclass

CERTIFY = ("tests/test_invariants_certify.py", "tests/test_certify_core.py")
ATTACKS = ("tests/test_invariants_attacks.py",)
TRAIN_NOISE = ("tests/test_invariants_training.py", "-k", "noise or remainder")
TRAIN_SAMPLING = ("tests/test_invariants_training.py", "-k", "poisson or sampler")
TRAIN_REPORTS = ("tests/test_invariants_training.py", "-k", "accountant or reports")
SMIN = ("tests/test_invariants_training.py", "tests/test_smin.py")
AUTH = ("tests/test_serving.py", "-k", "api_key")
VALIDATION = ("tests/test_serving.py", "-k", "json_validation")
SCHEDULER = ("tests/test_serving_scheduler.py", "-k", "largest or waits_one_round or overload or door")
NOISE_KEY = ("tests/test_serving_scheduler.py", "-k", "noise_key or keyed_seeds or canonical")
INTEGRITY = ("tests/test_invariants_training.py", "-k", "checkpoint")
LINE16 = ("tests/test_invariants_training.py", "tests/test_private_train.py::test_line16")
EMPTY_BATCH = ("tests/test_private_train.py::test_empty_poisson_batch_still_noised_and_counted",)
NOISE = ("tests/test_invariants_training.py",
         "tests/test_private_train.py::test_noise_std_matches_multiplier_times_clip_norm")
AUDIT_CONFIDENCE = ("tests/test_privacy_audit.py", "-k", "confidence or correct_sepdp")
AUDIT_VERDICT = ("tests/test_privacy_audit.py", "-k", "verdict or halved or correct_sepdp")
GHOST = ("tests/test_ghost_clipping.py", "-k", "per_example_loop or chunkings")
CLIPPING = ("tests/test_invariants_training.py", "tests/test_private_train.py::test_clipping_bounds_per_example_norms")


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # file, relative to the repository root
    function: str  # qualified name of the function holding the snippet, e.g. "Attack.project"
    original: str  # exact source text, found exactly once in that function
    replacement: str
    tests: tuple[str, ...]  # pytest arguments (files, -k expressions), relative to the root
    promise: str  # what the mutant breaks
    equivalent: str = ""  # if set: why no test can kill it (docs/DESIGN.md); a survival is then expected


MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------------------------ certificates and predictions
    Mutant("cp_two_sided_alpha", "transdenoiser/stats.py", "clopper_pearson_lower",
           'alpha=2 * alpha, method="beta"', 'alpha=alpha, method="beta"', CERTIFY,
           "one-sided Clopper-Pearson bound at level 1 - alpha"),
    Mutant("cp_upper_bound", "transdenoiser/stats.py", "clopper_pearson_lower",
           'method="beta")[0]', 'method="beta")[1]', CERTIFY, "the bound on pA is a lower bound"),
    Mutant("cp_zero_successes", "transdenoiser/stats.py", "clopper_pearson_lower",
           "return 0.0", "return 0.5", CERTIFY, "no votes: bound 0"),
    Mutant("radius_doubled", "certify/decisions.py", "radius_from_p_lower",
           "sigma * norm.ppf(p_lower)", "2 * sigma * norm.ppf(p_lower)", CERTIFY, "radius sigma * Phi^-1(pA)"),
    Mutant("comparison_unpaired", "certify/compare.py", "paired_outcomes",
           "(ours[picks] - theirs[picks])", "(ours[picks] - theirs[picks[::-1]])", ("tests/test_compare.py",),
           "a paired comparison resamples the same images for both runs"),
    Mutant("abstain_threshold", "certify/decisions.py", "certificate_from_counts",
           "if p_lower < 0.5:", "if p_lower < 0.45:", CERTIFY, "abstain when pA < 1/2"),
    Mutant("class_from_estimation", "certify/decisions.py", "certificate_from_counts",
           "top = int(selection.argmax())", "top = int(estimation.argmax())", CERTIFY,
           "the class comes from the selection sample"),
    Mutant("selection_reused", "certify/core.py", "Smooth.certify_many",
           "certificate_from_counts(c[0], c[1],", "certificate_from_counts(c[0] + c[1], c[1],", CERTIFY,
           "selection and estimation samples kept apart"),
    Mutant("predict_level_doubled", "certify/decisions.py", "prediction_from_counts",
           ".pvalue > alpha", ".pvalue > 2 * alpha", CERTIFY, "PREDICT's binomial test at level alpha"),
    Mutant("predict_all_votes", "certify/decisions.py", "prediction_from_counts",
           "binomtest(count_a, count_a + count_b, p=0.5)", "binomtest(count_a, int(counts.sum()), p=0.5)",
           CERTIFY, "PREDICT tests the two top counts"),
    Mutant("smoothing_noise_halved", "certify/core.py", "Smooth._count_packed",
           ".mul_(self.sigma)", ".mul_(self.sigma / 2)", CERTIFY, "noise N(0, sigma^2 I)"),
    Mutant("votes_counted_once_per_pass", "certify/core.py", "Smooth._count_packed",
           "counts.index_add_(0, votes, torch.ones_like(votes))",
           "counts.index_add_(0, votes.unique(), torch.ones_like(votes.unique()))", CERTIFY,
           "every noisy sample's vote is counted (counting on the device, without reading back)"),
    Mutant("padded_pass_cut", "certify/core.py", "padded_pass_size",
           "return min(batch_size, -(-size // step) * step)", "return min(batch_size, size // step * step)", CERTIFY,
           "a padded pass holds every sample of the pass"),
    Mutant("blocks_of_a_launch_drawn_as_one", "certify/core.py", "Smooth.queue_counts_blocks",
           "counts = self._queue_count(images, draws, generators)",
           "counts = self._queue_count(images, [(sum(d for d, _ in draws), [m for _, ms in draws for m in ms])], "
           "generators)", CERTIFY,
           "an image's noise is drawn block by block, whichever blocks a launch takes (the same answers)"),
    Mutant("launch_counts_its_first_block_only", "certify/streams.py", "run_blocks",
           "computed[streams] = group[-1][0] + int(group[-1][3].sum())",
           "computed[streams] = group[0][0] + int(group[0][3].sum())", ("tests/test_sequential.py",),
           "computed counts every sample a launch evaluates"),
    Mutant("logsumexp_ties_counted_once", "certify/one_sided.py", "logsumexp_last",
           "rest = np.where(rest == 0, rest, rest / count)", "rest = rest", ("tests/test_sequential.py",),
           "the mixtures' sums are scipy's logsumexp, equal largest terms included"),
    Mutant("block_reads_last_look", "certify/streams.py", "run_blocks",
           "stopped.argmax(axis=1), segments.size - 1)", "segments.size - 1 - stopped[:, ::-1].argmax(axis=1), "
           "segments.size - 1)", ("tests/test_sequential.py",),
           "a stream drawn in blocks stops at its first outcome, as look by look"),
    Mutant("alpha_zero_accepted", "certify/decisions.py", "validate_sampling",
           "if not 0 < alpha < 1:", "if not 0 <= alpha < 1:", CERTIFY, "alpha in (0, 1)"),
    # ------------------------------------------------------------------ attack budgets
    Mutant("pgd_iterates_unprojected", "certify/attacks/gradient.py", "_Iterative.iterate",
           "adv = self.project(adv + alpha * self.steepest_direction(grad), x, eps)",
           "adv = adv + alpha * self.steepest_direction(grad)", ATTACKS, "every iterate within budget"),
    Mutant("mim_iterates_unprojected", "certify/attacks/gradient.py", "MIM.perturb",
           "adv = self.project(adv + alpha * self.steepest_direction(momentum), x, eps)",
           "adv = adv + alpha * self.steepest_direction(momentum)", ATTACKS, "every iterate within budget"),
    Mutant("project_no_l2_ball", "certify/attacks/gradient.py", "Attack.project",
           "factor = torch.clamp(eps / (norms + TINY), max=1.0)", "factor = torch.ones_like(norms)", ATTACKS,
           "projection onto the L2 ball"),
    Mutant("project_no_linf_box", "certify/attacks/gradient.py", "Attack.project",
           "delta = torch.maximum(torch.minimum(delta, bound), -bound)", "delta = delta + 0 * bound", ATTACKS,
           "projection onto the Linf box"),
    Mutant("project_no_clip", "certify/attacks/gradient.py", "Attack.project",
           "return (x + delta).clamp(0.0, 1.0)", "return x + delta", ATTACKS, "pixels stay in [0, 1]"),
    Mutant("budget_not_rechecked", "certify/attacks/gradient.py", "Attack._enforce_budget",
           "            if not bool(over.any()):\n                return adv",
           "            return adv", ATTACKS, "realised norm <= exact eps after rounding"),
    # ------------------------------------------------------------------ authentication and request validation
    Mutant("api_key_not_compared", "serving/auth.py", "key_accepted",
           "return given is not None and hmac.compare_digest(given, api_key)", "return given is not None", AUTH,
           "a wrong key is refused"),
    Mutant("api_key_all_paths_open", "serving/auth.py", "ApiKeyMiddleware.__call__",
           'scope.get("path") in OPEN_PATHS', 'scope.get("path") not in ()', AUTH, "only probes are open"),
    Mutant("front_door_refuses_unauthenticated", "serving/front_door.py", "FrontDoor._authorized",
           "return self.api_key is None or key_accepted(", "return True or key_accepted(",
           ("tests/test_serving_front_door.py", "-k", "api_key or unauthenticated"),
           "with slots full, a request without the key still gets its 401, holding no slot"),
    Mutant("front_door_checks_without_taking", "serving/front_door.py", "FrontDoor.__call__",
           "release = scope[SLOT_KEY] = self.slots.take()", "release = lambda: None",
           ("tests/test_serving_front_door.py", "-k", "takes_the_slot"),
           "the door takes each body's slot as the request arrives, so a burst is refused at the door"),
    Mutant("abandoned_upload_keeps_its_slot", "serving/limits.py", "PayloadLimitMiddleware.__call__",
           "            release = scope[SLOT_KEY]\n", "            release = lambda: None  # noqa: E731\n",
           ("tests/test_serving_front_door.py", "-k", "abandoned"),
           "an upload abandoned mid-body gives its slot back at once, not when BentoML's timeout ends"),
    Mutant("unanswered_request_waits_the_timeout", "serving/library_patches.py", "cancel_request_timers",
           "        fut.add_done_callback(_ended)\n", "",
           ("tests/test_serving_library_patches.py", "-k", "ends_without_answering"),
           "a request whose application ended without answering ends then, not after BentoML's 600 s timeout"),
    Mutant("api_key_short_accepted", "serving/auth.py", "api_key_from_env",
           "if len(key) < MIN_KEY_LENGTH:", "if len(key) < 1:", AUTH, "short keys refused at start-up"),
    Mutant("pixels_above_one", "serving/validation.py", "check_pixels",
           "if low < 0.0 or high > 1.0:", "if low < 0.0:", VALIDATION, "pixels in [0, 1], never clipped"),
    Mutant("pixels_not_finite", "serving/validation.py", "check_pixels",
           "if not np.isfinite(array).all():", "if False:", VALIDATION, "NaN and inf refused"),
    Mutant("image_reshaped", "serving/validation.py", "check_pixels",
           "if tuple(array.shape) != tuple(shape):", "if array.size != int(np.prod(shape)):", VALIDATION,
           "images never reshaped"),
    Mutant("n_above_max", "serving/validation.py", "check_n",
           "if not 1 <= value <= config.max_n:", "if not 1 <= value:", VALIDATION, "n capped at max_n"),
    Mutant("client_seed_allowed", "serving/validation.py", "check_seed",
           "if not config.allow_client_seed:", "if False:", VALIDATION, "client seeds refused unless allowed"),
    Mutant("scheduler_fewest_left_first", "serving/compute/scheduler.py", "FairScheduler._next_pass",
           "ticket = self._tickets[0]\n            self._tickets.rotate(-1)",
           "ticket = min(self._tickets, key=lambda t: t.work.samples_left)\n"
           "            self._tickets.remove(ticket)\n            self._tickets.append(ticket)", SCHEDULER,
           "round robin: the largest admitted request keeps receiving passes"),
    Mutant("late_request_not_rescued", "serving/compute/scheduler.py", "FairScheduler._next_pass",
           "rescue = self.at_risk() if self._rescue_turn else None", "rescue = None",
           ("tests/test_serving_server_overload.py", "tests/test_serving_scheduler.py", "-k",
            "heavy_work_finishes or rate_falls"),
           "an admitted request that falls behind its deadline gets extra rounds and finishes (a real server first)"),
    Mutant("never_bound_at_the_full_rate", "serving/compute/admission.py", "admission",
           "if alone_s > RESCUE_SHARE * new_margin * deadline_s:", "if alone_s > new_margin * deadline_s:",
           ("tests/test_serving_scheduler.py", "-k", "admission_rules"),
           "a request admitted alone must fit at the half of the compute an admitted request is sure of, as one "
           "next to admitted work must (no starvation by a stream of small requests, no 504 after admission)"),
    Mutant("taken_jobs_share_a_chunk_seed", "serving/compute/engine.py", "CertifyWork.take",
           "job_seed(self.image_seeds[index], phase, chunk)", "job_seed(self.image_seeds[index], phase, 0)",
           ("tests/test_serving.py", "-k", "derives_each_seed or never_share"),
           "a certify request's noise jobs never share a draw (each chunk its own seed, derived as it is taken)"),
    Mutant("noise_key_constant_by_default", "serving/compute/noise.py", "NoiseKey.from_setting",
           "secrets.token_bytes(KEY_BYTES)", "bytes(KEY_BYTES)", NOISE_KEY,
           "an unset noise_key is a fresh random secret per start"),
    # ------------------------------------------------------------------ sampling
    Mutant("poisson_fixed_batch", "training/privacy/dp.py", "PoissonSampler.sample",
           "mask = torch.rand(self.num_examples, generator=generator) < self.sample_rate\n"
           "        return mask.nonzero().flatten()",
           "order = torch.randperm(self.num_examples, generator=generator)\n"
           "        return order[:round(self.sample_rate * self.num_examples)]", TRAIN_SAMPLING,
           "batch sizes Binomial(N, q)"),
    Mutant("poisson_always_empty", "training/privacy/dp.py", "PoissonSampler.sample",
           "return mask.nonzero().flatten()", "return mask.nonzero().flatten()[:0]", TRAIN_SAMPLING,
           "examples are sampled at all"),
    Mutant("poisson_same_batch_every_step", "training/privacy/dp.py", "PoissonSampler.sample",
           "torch.rand(self.num_examples, generator=generator)",
           "torch.rand(self.num_examples, generator=torch.Generator().manual_seed(0))", TRAIN_SAMPLING,
           "inclusion independent across steps"),
    Mutant("sampler_at_twice_q", "training/private_train.py", "train_denoiser",
           'PoissonSampler(num_examples, schedule["sample_rate"])',
           'PoissonSampler(num_examples, min(1.0, 2 * schedule["sample_rate"]))', TRAIN_SAMPLING,
           "the sampler's rate is the q the accountant is given"),
    # ------------------------------------------------------------------ clipping and noise
    Mutant("clip_at_2c", "training/privacy/dp.py", "PerExampleClipper.factors",
           "(self.clip_norm / (norms + 1e-12))", "(2 * self.clip_norm / (norms + 1e-12))", CLIPPING,
           "per-example gradients clipped to C"),
    Mutant("sepdp_clipping_skipped", "training/privacy/clipping.py", "ClippedGradients.__call__",
           "piece_factors = self.clipper.factors(norms)", "piece_factors = torch.ones_like(norms)", TRAIN_NOISE,
           "sepdp sums clipped gradients"),
    Mutant("ghost_norm_wrong_activation", "training/privacy/ghost_clipping.py", "GhostClipping._prepare",
           "normalised = F.group_norm(a, m.num_groups, eps=m.eps)", "normalised = a", GHOST,
           "GroupNorm's per-example gradient norm from its normalised input"),
    Mutant("ghost_layer_missing", "training/privacy/ghost_clipping.py", "GhostClipping.__call__",
           "squares = squares + self._prepare(layer, layer.inputs[0], grad_out, n).to(squares.dtype)",
           "squares = squares + self._prepare(layer, layer.inputs[0], grad_out, n).to(squares.dtype) * (layer is "
           "not self.layers[-1])", GHOST, "every layer's share of the per-example norm counted"),
    Mutant("ghost_norm_sqrt_dropped", "training/privacy/ghost_clipping.py", "GhostClipping.__call__",
           "GhostBatch(self, squares.sqrt(), losses)", "GhostBatch(self, squares, losses)", GHOST,
           "the norm is the square root of the summed squares"),
    Mutant("ghost_conv_norm_unsummed_draws", "training/privacy/ghost_clipping.py", "_conv_weight_norms",
           "per_row.reshape(n, rows // n, *weight.shape).sum(1)",
           "per_row.reshape(n, rows // n, *weight.shape).pow(2).sum(1).sqrt()",
           GHOST, "noise draws averaged before the norm, not after"),
    Mutant("group_weights_ignored", "training/privacy/dp.py", "PerExampleClipper.weighted_sum",
           'torch.einsum("n,n...->...", weights.to(g.dtype), g)', "g.sum(0)", CLIPPING,
           "each example counted once, clipped"),
    Mutant("gaussian_noise_halved", "training/privacy/dp.py", "GaussianNoise.add",
           "std = noise_multiplier * self.clip_norm", "std = 0.5 * noise_multiplier * self.clip_norm", NOISE,
           "noise std multiplier x C"),
    Mutant("sepdp_noise_halved", "training/arms.py", "DPArm.whole_batch_step",
           "self.noise.add(summed, multiplier, generator)",
           "self.noise.add(summed, multiplier / 2, generator)", TRAIN_NOISE,
           "sepdp noise xi_up x C on non-empty batches"),
    Mutant("uncredited_shortcut_when_creditable", "training/arms.py", "TransDenoiserArm.__init__",
           "self.credit_possible = not uncredited_by_construction(",
           "self.credit_possible = False and not uncredited_by_construction(", TRAIN_NOISE,
           "line 8's split and S_min are skipped only when no step can be credited"),
    Mutant("sepdp_empty_batch_noise_halved", "training/arms.py", "SepDPArm.gradient",
           "return self.finish(self.noise.add(self.zeros(), self.xi_up, generator))",
           "return self.finish(self.noise.add(self.zeros(), self.xi_up / 2, generator))", EMPTY_BATCH,
           "empty Poisson batches still noised"),
    Mutant("line17_noise_halved", "training/arms.py", "TransDenoiserArm.gradient",
           "group = self.noise.add(group, record.sigma_bar, generator)",
           "group = self.noise.add(group, record.sigma_bar / 2, generator)", TRAIN_NOISE,
           "Algorithm 1 line 17: sigma_bar x C"),
    Mutant("line22_noise_halved", "training/arms.py", "TransDenoiserArm.gradient",
           "group = self.noise.add(group, self.xi_up, generator)",
           "group = self.noise.add(group, self.xi_up / 2, generator)", TRAIN_NOISE,
           "Algorithm 1 line 22: xi_up x C"),
    Mutant("merged_step_noise_halved", "training/arms.py", "TransDenoiserArm.gradient",
           "return self.finish(self.noise.add(summed, self.xi_up, generator)), record",
           "return self.finish(self.noise.add(summed, self.xi_up / 2, generator)), record", TRAIN_NOISE,
           "an uncredited Algorithm 1 step adds xi_up x C once"),
    Mutant("explicit_multiplier_overstated", "training/arms.py", "TransDenoiserArm.gradient",
           "record.explicit_multiplier = math.sqrt(explicit_variance)",
           "record.explicit_multiplier = 2 * math.sqrt(explicit_variance)", TRAIN_NOISE,
           "the step history holds the noise actually added"),
    Mutant("input_multiplier_doubled", "training/arms.py", "TransDenoiserArm.gradient",
           "record.input_multiplier = (self.config.sigma * math.sqrt(",
           "record.input_multiplier = (2 * self.config.sigma * math.sqrt(", TRAIN_NOISE,
           "m_t = sigma sqrt(T S_min) / C"),
    Mutant("remainder_tolerance_sign", "training/arms.py", "TransDenoiserArm.nonnegative",
           "return remainder >= tolerance", "return remainder >= -tolerance", TRAIN_NOISE,
           "rounding only pushes examples to the full-noise side"),
    Mutant("line16_subtracts", "training/arms.py", "line16_sigma_bar",
           "return math.sqrt(xi_up ** 2 - input_multiplier ** 2)", "return xi_up - input_multiplier", LINE16,
           "line 16: sigma_bar = sqrt(xi_up^2 - m^2)"),
    Mutant("line16_low_branch", "training/arms.py", "line16_sigma_bar",
           "if input_multiplier < xi_low:\n        return xi_up", "if input_multiplier < xi_low:\n        return 0.0",
           LINE16, "line 16: full noise below xi_low"),
    Mutant("cpu_noise_off_the_run_generator", "training/privacy/dp.py", "_draw",
           "return torch.randn(shape, generator=generator, dtype=torch.float32).to(device, dtype)",
           "return torch.randn(shape, dtype=torch.float32).to(device, dtype)",
           ("tests/test_private_train.py", "-k", "run_generator"),
           "the training noise comes from the run's secret generator (its saved state resumes a run)"),
    Mutant("ghost_products_keep_tf32", "training/privacy/ghost_clipping.py", "_float32_products",
           "torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = False, False",
           "torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = previous",
           ("tests/test_ghost_clipping.py", "-k", "tf32"),
           "a ghost norm and its weighted sum are formed in float32 on CUDA, not TF32"),
    # ------------------------------------------------------------------ S_min
    Mutant("smin_rounding_bound_dropped", "training/privacy/smin.py", "smallest_eigenvalue_lower_bound",
           "return max(0.0, raw - bound), raw, bound", "return max(0.0, raw), raw, bound", SMIN,
           "S_min never overestimated"),
    Mutant("smin_zero_row_shortcut_off", "training/privacy/smin.py", "smin_lower_bound",
           "if bool((torch.diagonal(gram) == 0).any()):", "if False:", SMIN, "S_min = 0 for a zero row",
           equivalent="a zero row makes K singular: eigvalsh then returns a smallest eigenvalue within rounding of "
                      "0, and the rounding bound takes it to 0; the shortcut only saves the eigensolver"),
    # ------------------------------------------------------------------ accounting and reports
    Mutant("report_sepdp_steps_halved", "training/privacy/report.py", "build_privacy_report",
           'SEPDP_LABEL, "data_independent": True,\n                                     "noise_multiplier": xi_up,'
           '\n                                     "epsilon": epsilon_report(sample_rate, xi_up, steps_done, delta)',
           'SEPDP_LABEL, "data_independent": True,\n                                     "noise_multiplier": xi_up,'
           '\n                                     "epsilon": epsilon_report(sample_rate, xi_up, '
           'steps_done // 2, delta)',
           TRAIN_REPORTS, "sepdp epsilon over the steps taken"),
    Mutant("report_sepdp_equivalent_steps_halved", "training/privacy/report.py", "build_privacy_report",
           '"data_independent": True, "noise_multiplier": xi_up,\n                                     "epsilon": '
           'epsilon_report(sample_rate, xi_up, steps_done, delta)',
           '"data_independent": True, "noise_multiplier": xi_up,\n                                     "epsilon": '
           'epsilon_report(sample_rate, xi_up, steps_done // 2, delta)',
           TRAIN_REPORTS, "transdenoiser's sepdp-equivalent epsilon over the steps taken"),
    Mutant("report_mmga_steps_halved", "training/privacy/report.py", "build_privacy_report",
           '"noise_multiplier": xi_up,\n                                 "epsilon": epsilon_report(sample_rate, '
           'xi_up, steps_done, delta)',
           '"noise_multiplier": xi_up,\n                                 "epsilon": epsilon_report(sample_rate, '
           'xi_up, steps_done // 2, delta)', TRAIN_REPORTS, "MMGA epsilon over the steps taken"),
    Mutant("report_explicit_multipliers_doubled", "training/privacy/report.py", "build_privacy_report",
           "epsilon_report(sample_rate, explicit.tolist(), steps_done, delta)",
           "epsilon_report(sample_rate, (2 * explicit).tolist(), steps_done, delta)", TRAIN_REPORTS,
           "explicit-noise epsilon from the noise actually added"),
    Mutant("report_steps_from_history_halved", "training/privacy/report.py", "build_privacy_report",
           'steps_done = int(len(history["batch_size"]))', 'steps_done = int(len(history["batch_size"])) // 2',
           TRAIN_REPORTS, "every step counted"),
    Mutant("accountant_steps_halved", "training/privacy/accounting.py", "_check_multipliers",
           'counts = {_finite_real("noise_multiplier", noise_multipliers): steps}',
           'counts = {_finite_real("noise_multiplier", noise_multipliers): steps // 2}', TRAIN_REPORTS,
           "the accountant composes every step"),
    Mutant("resume_drops_a_step", "training/train_state.py", "resume_training_state",
           "records = _records_from_tensors(tensors)", "records = _records_from_tensors(tensors)[1:]", TRAIN_REPORTS,
           "resume never loses a step"),
    # ------------------------------------------------------------------ the privacy audit
    Mutant("audit_bounds_ignore_confidence", "training/privacy/bounds.py", "one_run_lower_bounds",
           "level = beta / len(counts)", "level = DEFAULT_BETA / len(counts)", AUDIT_CONFIDENCE,
           "the lower bounds hold at the confidence asked for (--confidence)"),
    Mutant("audit_cli_ignores_confidence", "training/privacy/audit_cli.py", "cmd_privacy_audit",
           "beta=1 - args.confidence", "beta=1 - DEFAULT_CONFIDENCE", AUDIT_CONFIDENCE,
           "privacy-audit passes --confidence to the bounds"),
    Mutant("audit_misses_noise_halved", "training/privacy/dp.py", "GaussianNoise.add",
           "std = noise_multiplier * self.clip_norm", "std = 0.5 * noise_multiplier * self.clip_norm",
           ("tests/test_privacy_audit.py", "-k", "correct_sepdp"),
           "the privacy audit fails a run whose DP noise is secretly halved (check against the claimed noise)"),
    Mutant("audit_consistency_ignored", "training/privacy/audit.py", "verdict",
           'inconsistent = consistency is not None and consistency.get("applicable") and not consistency["consistent"]',
           "inconsistent = False", AUDIT_VERDICT, "a run inconsistent with the claimed noise is a FAILURE"),
    Mutant("audit_power_ignored", "training/privacy/power.py", "audit_power",
           '"refutable": any(attainable[a] > epsilon for a in ANALYSES)', '"refutable": True', AUDIT_VERDICT,
           "a claim beyond the audit's reach is INCONCLUSIVE, not PASS"),
    # ------------------------------------------------------------------ checkpoint integrity
    Mutant("checkpoint_hash_unchecked", "training/checkpoint.py", "load_tensors",
           "if hashlib.sha256(data).hexdigest() != expected_sha256:", "if False:", INTEGRITY,
           "modified weights refused"),
)
