"""The bundled zh-TW <-> en translators: corpus, vocabulary, models, training, export, evaluation, cards."""
